"""Expert parallelism over torch.distributed: which experts a rank holds, and the all-reduce that
sums the routed outputs.

Rank r of N holds experts [r*E/N, (r+1)*E/N) of every MoE layer and computes them for every token;
attention, the router, the shared experts and the dense layers are replicated. Each rank hands the
all-reduce its per-(token, choice) outputs: a pair routed to another rank's expert is an exact zero
here, so every element of the sum has one nonzero term and the sum is exact whatever order the
collective adds in. The result is the 1-rank layer's bits on every rank, and as batch-invariant as
it (the combine then sums a token's choices in its fixed order: engine.model.MoE.combine, or on
CUDA triton_kernels.fused_moe.combine_pairs). The cost
is top-k times the bytes of reducing each rank's partial sums, whose rounding would depend on the
collective's chunking and so on the batch.

Processes follow torchrun's conventions (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); the backend
is gloo on the CPU and NCCL on CUDA. Every collective has a timeout, so a rank that dies or hangs
ends the others with one line instead of a hang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from engine.errors import EngineError
from engine.nvtx_ranges import Nvtx
from engine.stages import MOE_ALL_REDUCE

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ExpertShard:
    """The experts of one rank of `world`: a contiguous slice of the layer's experts."""

    rank: int
    world: int

    def experts(self, n_experts: int) -> range:
        self.require_divides(n_experts)
        per_rank = n_experts // self.world
        return range(self.rank * per_rank, (self.rank + 1) * per_rank)

    def require_divides(self, n_experts: int) -> None:
        """Every rank holds the same number of experts, at least one."""
        if self.world > n_experts:
            raise EngineError(f"--ranks {self.world}: more ranks than the model's {n_experts} routed experts "
                              "(each rank holds at least one)")
        if n_experts % self.world:
            raise EngineError(f"--ranks {self.world}: the model's {n_experts} routed experts do not divide evenly "
                              f"among {self.world} ranks")


class ExpertParallel:
    """The process group of the expert-parallel ranks and the MoE's one collective."""

    def __init__(self, shard: ExpertShard, timeout_s: float):
        self.shard, self.timeout_s = shard, timeout_s
        self.nvtx = Nvtx()  # the engine hands over its own (engine.Engine), so warm-up leaves no ranges

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks in place (a no-op on one rank), inside the `moe_all_reduce` range."""
        if self.shard.world == 1:
            return tensor
        import torch.distributed as dist

        with self.nvtx.range(MOE_ALL_REDUCE):
            try:
                dist.all_reduce(tensor)
            except RuntimeError as error:  # torch.distributed's errors (DistBackendError, ...) are RuntimeErrors
                raise EngineError(f"rank {self.shard.rank}: the MoE all-reduce with the other "
                                  f"{self.shard.world - 1} ranks failed (a rank stopped or did not answer within "
                                  f"{self.timeout_s:g} s): {str(error).splitlines()[0]}") from None
        return tensor

    def close(self) -> None:
        """Leave the group once every rank is done: rank 0 hosts the group's store, and tearing it
        down while another rank still talks to it aborts rank 0 at exit (`terminate called without
        an active exception`, seen in 1 of 4 runs here without the barrier)."""
        import torch.distributed as dist

        if self.shard.world > 1 and dist.is_initialized():
            try:
                dist.barrier()
            except RuntimeError:  # a rank already failed: its error is the one to report
                pass
            dist.destroy_process_group()


def from_environment(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ExpertParallel | None:
    """The group this process belongs to by torchrun's variables, joined now; None when WORLD_SIZE
    is unset (a single process)."""
    if "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise EngineError("WORLD_SIZE is set, so RANK must be too, both whole numbers (torchrun's variables)") from None
    if not 0 <= rank < world:
        raise EngineError(f"RANK {rank} must lie in [0, WORLD_SIZE {world})")
    shard = ExpertShard(rank, world)
    if world > 1:
        import torch.distributed as dist

        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        try:
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as error:
            raise EngineError(f"rank {rank}: cannot join the {world} ranks at {os.environ.get('MASTER_ADDR')}:"
                              f"{os.environ.get('MASTER_PORT')} ({str(error).splitlines()[0]})") from None
    return ExpertParallel(shard, timeout_s)
