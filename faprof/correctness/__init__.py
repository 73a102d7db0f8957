"""Correctness: is a variant's answer right, and if not, which bug does its error look like.

The reference (reference: attention from the definition at full precision, and PyTorch's own error
in the problem's dtype), the inputs and the check of one call against it (check), the adversarial
probes that catch what random inputs hide (adversarial), where a wrong output is wrong (errormap,
errormap_axes, positions), the problem's tensors in each layout (layouts), the bug families a
wrong result matches (signatures) and their plain-text summary (wrong_text).

Imports only faprof.variants and below: the timing harness (faprof.timing) calls this package
before it times a call; nothing here times anything.
"""
