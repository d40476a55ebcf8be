"""The embedded engine: a Kimi-K2-style MLA+MoE target decoded with DDTree, NVTX-instrumented."""
