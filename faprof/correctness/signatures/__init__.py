"""Bug signatures: which known family of attention bug explains a wrong result (see identify.py).

The package holds the case under test (case), the alternative references each family is tested
against (refs), the families themselves (families, stride, placement: where the work sits, heads: the
KV head a query head reads, layout: packed and paged problems, crossing: a packed sequence's key range
crossing into its neighbour), how a candidate is matched against the error map (match) and the ranking
that ties them together (identify). Callers use the names below.
"""

from faprof.correctness.signatures.case import FAMILIES, MAX_ROWS, Signature
from faprof.correctness.signatures.identify import diagnose_wrong, race_signature, rank
from faprof.correctness.signatures.placement import slice_signatures

__all__ = ["FAMILIES", "MAX_ROWS", "Signature", "diagnose_wrong", "race_signature", "rank", "slice_signatures"]
