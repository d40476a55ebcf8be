"""CUDA graphs of the static-shape step: one per stage and batch bucket, recorded before any request.

`record_graphs` warms every bucket's stages up eagerly (Triton compiles, the allocator settles),
then records one graph per graphed stage (`StaticStep.graphed_stages`) and bucket. From then on the
step replays a stage's graph inside the stage's NVTX range (`StaticStep.run_stages`), so the NVTX
contract and ddprof's per-stage attribution hold with graphs as without.

Buckets are recorded largest first into one shared memory pool: only one bucket's step runs at a
time, so the smaller buckets reuse what the largest one needed. What the largest needs is measured
before recording it (the peak of one eager step there, over what was allocated before); a bucket
whose graphs cannot fit in the free GPU memory is refused in one line before serving. Padding rows
point at the scratch slot, so warm-up touches no request (there is none yet anyway).

Verified on the H200 (tests/engine/test_static_step.py's CUDA tests, at e248799) before the static
step kept its slots' state on the device (engine/static_step.py): those tests run again first on
the next GPU.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from engine.errors import EngineError
from engine.static_step import BucketStep, StaticStep

GIB = 2**30
WARM_UP_STEPS = 2  # eager steps per bucket before recording: the first compiles, the second runs as replays will


@dataclass(frozen=True)
class GraphRecording:
    """What `record_graphs` did, for the run's summary."""

    buckets: tuple[int, ...]
    record_s: float  # warm-up and recording, all buckets
    pool_bytes: int  # GPU memory the graphs' pool reserved


def require_graphable(device: str, mode: str) -> None:
    """--cuda-graphs needs a CUDA device and DDTree decoding (the static-shape step): else one line."""
    if device != "cuda":
        raise EngineError(f"--cuda-graphs: needs a CUDA device (the engine is on {device})")
    if mode != "ddtree":
        raise EngineError("--cuda-graphs: only for --mode ddtree (the static-shape step is DDTree's)")


def record_graphs(static: StaticStep) -> GraphRecording:
    """Record every bucket's graphs and switch `static` to replaying them."""
    device = static.inputs.device
    start = time.perf_counter()
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}
    for bucket in reversed(static.buckets):
        step = padding_step(static, bucket)
        with _out_of_memory_as_error(bucket, device):
            if bucket == static.buckets[-1]:
                _check_fits(static, step, bucket, device)
                reserved_before = torch.cuda.memory_reserved(device)  # the eager step's blocks given back
            _warm_up(static, step, bucket)
            for stage in static.graphed_stages:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    getattr(step, stage)()
                graphs[bucket, stage] = graph
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # what the warm-ups cached goes back: what stays reserved is the graphs' pool
    static.replay = lambda bucket, stage: graphs[bucket, stage].replay()
    return GraphRecording(static.buckets, time.perf_counter() - start,
                          torch.cuda.memory_reserved(device) - reserved_before)


def padding_step(static: StaticStep, bucket: int) -> BucketStep:
    """The bucket's step with every row a padding row (the scratch slot): safe to run at any time."""
    return static.fill([[pad] * bucket for pad in static.padding])


def _warm_up(static: StaticStep, step: BucketStep, bucket: int) -> None:
    """Eager steps on a side stream (as graph capture wants), tree_build included for the CPU builder."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARM_UP_STEPS):
            static.run_stages(step, bucket)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def _check_fits(static: StaticStep, step: BucketStep, bucket: int, device: torch.device) -> None:
    """Refuse before recording when the largest bucket's graphs need more memory than is free: the
    graphs' pool holds what one eager step at that bucket allocates at its peak."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    static.run_stages(step, bucket)
    torch.cuda.synchronize(device)
    needed = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()  # the eager step's blocks go back: the graphs' private pool cannot use them
    free = torch.cuda.mem_get_info(device)[0]
    if needed > free:
        raise EngineError(f"--cuda-graphs: batch bucket {bucket} needs {needed / GIB:.2f} GiB for its graphs, "
                          f"{free / GIB:.2f} GiB free on {torch.cuda.get_device_name(device)}; lower --concurrency "
                          "or run --no-cuda-graphs")


@contextmanager
def _out_of_memory_as_error(bucket: int, device: torch.device):
    """An allocation failure while warming up or recording a bucket, as one line naming the bucket."""
    try:
        yield
    except torch.OutOfMemoryError:
        free = torch.cuda.mem_get_info(device)[0]
        raise EngineError(f"--cuda-graphs: batch bucket {bucket} does not fit in GPU memory ({free / GIB:.2f} GiB "
                          "free); lower --concurrency or run --no-cuda-graphs") from None
