"""Triton kernels for the DDTree decode step: each file holds a kernel and its launcher, and names the
plain PyTorch reference its tests compare it with (the engine's own code in engine/, or, for
combine_splits, a function beside the kernel)."""
