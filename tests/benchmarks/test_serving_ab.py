"""What the serving A/Bs record beside tok/s: the caching allocator's device calls per serve."""

import pytest
import torch

from benchmarks.serving_ab import allocator_counts


def test_the_cpu_has_no_allocator_counts():
    assert allocator_counts("cpu") == {}


@pytest.mark.gpu
def test_a_fresh_allocation_counts_one_cudamalloc_on_gpu():
    torch.cuda.empty_cache()  # nothing cached: the next block must come from cudaMalloc
    before = allocator_counts("cuda")
    block = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    after = allocator_counts("cuda")
    assert after["num_device_alloc"] == before["num_device_alloc"] + 1
    assert after["num_alloc_retries"] >= before["num_alloc_retries"]
    del block
