"""engine/host_to_device.py: host ints on the device, on the GPU without a host wait."""

import pytest
import torch

from engine.host_to_device import int64_on


def test_values_and_shapes_on_the_cpu():
    many, one = int64_on([3, 1, 4], torch.device("cpu")), int64_on(5, torch.device("cpu"))
    assert many.dtype == torch.int64 and many.tolist() == [3, 1, 4]
    assert one.shape == () and int(one) == 5


@pytest.mark.gpu
def test_a_copy_to_the_gpu_never_waits_for_it():
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda._sleep(10_000_000)  # keep the stream busy: a waiting copy would block here
    torch.cuda.set_sync_debug_mode("error")
    try:
        values = int64_on(list(range(1000)), device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert values.device == device and values.cpu().tolist() == list(range(1000))
