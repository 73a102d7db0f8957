"""Measuring stage: where and how a wrong result is wrong (error maps, bug signatures, adversarial inputs)."""
