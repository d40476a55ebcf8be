"""The static-shape DDTree step: the same stages as `DDTreeDecoder.step`, on shapes fixed per batch bucket.

A CUDA graph replays fixed shapes at fixed addresses, and a host that never waits for the GPU can
run ahead of it. So this step

- pads the batch to a bucket (`batch_buckets`: 1, 2, 4, 8, 16, 24, 32, 48, 64, then multiples of
  32, the slot count last); padding rows point at the cache's scratch slot (prefix 0, bonus 0,
  seed 0), whose cache, drafter-cache and pending-feature rows no request owns;
- keeps slots / prefix lengths / bonus tokens / seeds in one persistent device buffer that each
  step fills with one copy from pinned memory; every bucket's stages read fixed views of it;
- has the drafter attend over its whole context capacity (masked), not over a length read back
  from the device; trees are `budget` nodes already;
- commits the step's tokens in `sampling` with one asynchronous copy into pinned memory and an
  event: the step's one wait. With the CPU builder, tree_build also copies the top-k to the host
  and the tree back (the round trip a CPU builder costs any engine).

Nothing in draft, tree_build (GPU builder), verify, accept or kv_compact reads the device from the
host or makes a data-dependent shape, so each can be one CUDA graph per bucket
(engine/cuda_graphs.py). Without graphs (on the CPU, or CUDA with --no-cuda-graphs) the same code
runs eagerly. The padding changes no request's tokens: every op computes a row independently of
the others (model.linear, attention.tree_attention), and lossless decoding emits AR's tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.ddtree import ACCEPT, DRAFT, KV_COMPACT, SAMPLING, TREE_BUILD, VERIFY, DDTreeDecoder, StepResult, commit
from engine.nvtx_ranges import Nvtx
from engine.tree import TreeBatch, build_tree_cpu

BASE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
BUCKET_STEP = 32  # past the base buckets, batch sizes grow by this
INPUTS = ("slots", "prefix_lens", "bonus", "seeds")  # the rows of the step's input buffer


def batch_buckets(n_slots: int) -> tuple[int, ...]:
    """The batch sizes a step is padded to, up to `n_slots` (always the last)."""
    base = [b for b in BASE_BUCKETS if b < n_slots]
    beyond = range(BASE_BUCKETS[-1] + BUCKET_STEP, n_slots, BUCKET_STEP)
    return (*base, *beyond, n_slots)


def bucket_for(buckets: tuple[int, ...], batch_size: int) -> int:
    """The smallest bucket holding `batch_size` rows."""
    return next(b for b in buckets if b >= batch_size)


class BucketStep:
    """One bucket's stages over fixed views of the step's input buffer. Each stage leaves its outputs
    as attributes, which the next stage reads: in CUDA graphs, the graphs' static outputs."""

    def __init__(self, decoder: DDTreeDecoder, inputs: torch.Tensor, host_builder: bool):
        self.decoder = decoder
        self.slots, self.prefix_lens, self.bonus, self.seeds = inputs
        self.tree: TreeBatch | None = placeholder_tree(inputs.shape[1], decoder) if host_builder else None

    def draft(self) -> None:
        self.top = self.decoder.draft(self.slots, self.prefix_lens, self.bonus, self.decoder.drafter_cache.rows)

    def tree_build(self) -> None:
        """The GPU builder, on the device."""
        self.tree = self.decoder.build_tree(*self.top, self.decoder.budget)

    def tree_build_on_host(self, rows: int) -> None:
        """The CPU builder over the first `rows` (the requests): top-k to the host, heapq, the trees
        back into the bucket's tree buffers (the padding rows keep a valid tree from before)."""
        built = build_tree_cpu(self.top[0][:rows], self.top[1][:rows], self.decoder.budget)
        for static, host in zip(self.tree.tensors(), built.tensors()):
            static[:rows].copy_(host, non_blocking=True)

    def verify(self) -> None:
        self.choice, self.features = self.decoder.verify(self.tree, self.slots, self.prefix_lens, self.bonus,
                                                         self.seeds)

    def accept(self) -> None:
        self.accepted, self.accept_len, self.next_bonus = self.decoder.accept(self.tree, self.choice)

    def kv_compact(self) -> None:
        self.decoder.compact(self.slots, self.prefix_lens, self.accepted, self.accept_len, self.features)

    def committed_rows(self) -> torch.Tensor:
        return self.decoder.committed_rows(self.tree, self.accepted, self.accept_len, self.next_bonus)


def placeholder_tree(rows: int, decoder: DDTreeDecoder) -> TreeBatch:
    """A valid tree per row on the decoder's device (equal log-probs, ids 0..K-1): what a padding
    row verifies until a real tree lands in its buffer."""
    shape = (rows, decoder.depth, decoder.top_k)
    ids = torch.arange(decoder.top_k, dtype=torch.int64).expand(shape)
    return build_tree_cpu(torch.zeros(shape), ids, decoder.budget).to(decoder.target.device)


class StaticStep:
    """Runs `DDTreeDecoder`'s stages padded to buckets; `replay`, once engine/cuda_graphs.py set it,
    runs a recorded graph in place of a stage's eager code."""

    def __init__(self, decoder: DDTreeDecoder, n_slots: int, scratch_slot: int, nvtx: Nvtx, host_builder: bool):
        self.decoder, self.nvtx, self.host_builder = decoder, nvtx, host_builder
        self.buckets = batch_buckets(n_slots)
        self.padding = (scratch_slot, 0, 0, 0)  # one value per INPUTS row
        device = decoder.target.device
        pinned = device.type == "cuda"  # the host buffers the device copies to and from asynchronously
        biggest = self.buckets[-1]
        self.inputs = torch.zeros(len(INPUTS), biggest, dtype=torch.int64, device=device)
        self.staged_inputs = torch.zeros(len(INPUTS), biggest, dtype=torch.int64, pin_memory=pinned)
        self.landed = torch.zeros(biggest, decoder.depth + 2, dtype=torch.int64, pin_memory=pinned)
        self.landed_event = torch.cuda.Event() if pinned else None
        self.bucket_steps = {b: BucketStep(decoder, self.inputs[:, :b], host_builder) for b in self.buckets}
        self.replay: Callable[[int, str], None] | None = None

    @property
    def graphed_stages(self) -> tuple[str, ...]:
        """The stages that are device work only: all but sampling, and tree_build with the CPU builder."""
        return (DRAFT, VERIFY, ACCEPT, KV_COMPACT) if self.host_builder else (DRAFT, TREE_BUILD, VERIFY, ACCEPT,
                                                                              KV_COMPACT)

    def fill(self, columns: list[list[int]]) -> BucketStep:
        """Copy one value per request and INPUTS row into the input buffer, padded to a bucket."""
        bucket = bucket_for(self.buckets, len(columns[0]))
        padded = [column + [pad] * (bucket - len(column)) for column, pad in zip(columns, self.padding)]
        self.staged_inputs[:, :bucket] = torch.tensor(padded, dtype=torch.int64)
        # The previous step's copy out of staged_inputs is done: its commit waited for everything before it.
        self.inputs[:, :bucket].copy_(self.staged_inputs[:, :bucket], non_blocking=True)
        return self.bucket_steps[bucket]

    def run_stages(self, step: BucketStep, requests: int) -> None:
        """draft .. kv_compact, each inside its NVTX range: a graph replay where one is recorded."""
        bucket = step.slots.shape[0]
        for stage in (DRAFT, TREE_BUILD, VERIFY, ACCEPT, KV_COMPACT):
            with self.nvtx.range(stage):
                if stage == TREE_BUILD and self.host_builder:
                    step.tree_build_on_host(requests)
                elif self.replay is not None:
                    self.replay(bucket, stage)
                else:
                    getattr(step, stage)()

    def step(self, columns: list[list[int]], remaining: list[int], eos_ids: list[int | None]) -> StepResult:
        """One step over the requests whose `columns` (one list per INPUTS row) are given."""
        requests = len(columns[0])
        step = self.fill(columns)
        self.run_stages(step, requests)
        with self.nvtx.range(SAMPLING):
            landed = self.landed[:step.slots.shape[0]]
            landed.copy_(step.committed_rows(), non_blocking=True)
            if self.landed_event is not None:  # the step's one wait
                self.landed_event.record()
                self.landed_event.synchronize()
            return commit(landed[:requests].tolist(), remaining, eos_ids)
