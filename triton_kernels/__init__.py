"""Triton kernels for the DDTree decode step; each file holds a kernel, its launcher and reference."""
