"""Test tiers: everything runs on the CPU (Triton through its interpreter) except `gpu`-marked tests."""

import os

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
    # Tests use small tensors: one thread is as fast and keeps parallel test runs from thrashing.
    torch.set_num_threads(1)
except ImportError:  # the nsys toolchain tests need no torch
    HAS_CUDA = False

if not HAS_CUDA:
    # Must be set before triton is imported anywhere: CPU tests run Triton kernels interpreted.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
