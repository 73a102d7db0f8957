"""faprof: profile FlashAttention-style kernels and explain why one is slower than another."""

__version__ = "0.1.0"
