"""Host integers onto the engine's device without waiting for it.

`torch.tensor(values, device="cuda")` copies from pageable memory and then waits for the stream:
a host wait per call, which an engine whose host runs ahead of the GPU (admitting while a step is
in flight) cannot afford. Through pinned memory the copy is asynchronous, and PyTorch's pinned
allocator keeps the buffer until the copy has run. On the CPU it is a plain tensor.
"""

from __future__ import annotations

import torch


def int64_on(values: list[int] | int, device: torch.device) -> torch.Tensor:
    """`values` as an int64 tensor on `device` (a 0-d tensor for one int), copied without a wait."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.int64, device=device)
    return torch.tensor(values, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)
