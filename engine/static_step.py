"""The static-shape DDTree step: the same stages as `DDTreeDecoder.step`, on shapes fixed per batch bucket.

A CUDA graph replays fixed shapes at fixed addresses, and a host that never waits for the GPU can
run ahead of it. So this step

- pads the batch to a bucket (`batch_buckets`: 1, 2, 4, 8, 16, 24, 32, 48, 64, then multiples of
  32, the slot count last); padding rows point at the cache's scratch slot (prefix 0, bonus 0,
  seed 0), whose cache, drafter-cache and pending-feature rows no request owns;
- keeps each slot's prefix length and bonus token on the device (`slot_state`): draft gathers its
  rows' values from there and kv_compact advances them, so a step's inputs are what the previous
  step wrote, never a value the host read back; only slots and seeds (host knowledge) come from the
  host, with one copy from pinned memory into a persistent device buffer whose fixed views every
  bucket's stages read. That is what lets the host launch step N+1 before step N's tokens reach it
  (`--overlap`, engine/engine.py);
- has the drafter attend over its whole context capacity (masked), not over a length read back
  from the device; trees are `budget` nodes already;
- sends the step's tokens in `sampling` with one asynchronous copy into pinned memory and an
  event (`send`); `land` waits for that event: the step's one wait, now or (overlapped) after the
  next step is launched. Pinned buffers alternate between consecutive steps, so a step in flight
  never shares one with the step being launched. With the CPU builder, tree_build also copies the
  top-k to the host and the tree back (the round trip a CPU builder costs any engine): that waits
  for the same step's draft, so an overlapped host runs ahead only up to draft.

Nothing in draft, tree_build (GPU builder), verify, accept or kv_compact reads the device from the
host or makes a data-dependent shape, so each can be one CUDA graph per bucket
(engine/cuda_graphs.py). Without graphs (on the CPU, or CUDA with --no-cuda-graphs) the same code
runs eagerly where the engine asks for the static step (`static_shapes`, or --overlap); otherwise the
engine runs `DDTreeDecoder.step`. The padding changes no request's tokens: every op computes a row independently of
the others (model.linear, attention.tree_attention), and lossless decoding emits AR's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from engine.ddtree import ACCEPT, DRAFT, KV_COMPACT, TREE_BUILD, VERIFY, DDTreeDecoder
from engine.nvtx_ranges import Nvtx
from engine.tree import TreeBatch, build_tree_cpu

BASE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
BUCKET_STEP = 32  # past the base buckets, batch sizes grow by this
INPUTS = ("slots", "seeds", "prefix_lens", "bonus")  # the rows of the step's input buffer
HOST_INPUTS = 2  # the first rows (slots, seeds) the host fills; draft gathers the others from slot_state
PREFIX, BONUS = 0, 1  # the rows of slot_state


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

    def __init__(self, decoder: DDTreeDecoder, inputs: torch.Tensor, slot_state: torch.Tensor, scratch_slot: int,
                 host_builder: bool):
        self.decoder, self.slot_state, self.scratch_slot = decoder, slot_state, scratch_slot
        self.slots, self.seeds, self.prefix_lens, self.bonus = inputs
        self.tree: TreeBatch | None = placeholder_tree(inputs.shape[1], decoder) if host_builder else None
        # A request's prefix never reaches this (engine.can_admit); a step whose tokens are discarded
        # (its request stopped in the step before, --overlap) may, and must not write past the cache.
        self.longest_prefix = decoder.cache.max_len - 1 - decoder.budget

    def draft(self) -> None:
        self.prefix_lens.copy_(self.slot_state[PREFIX][self.slots])
        self.bonus.copy_(self.slot_state[BONUS][self.slots])
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
        self.advance()

    def advance(self) -> None:
        """The next step's inputs, on the device: each slot's prefix grows by the bonus and the
        accepted rows, its bonus is the target's next token; the scratch slot goes back to 0."""
        grown = (self.prefix_lens + 1 + self.accept_len).clamp(max=self.longest_prefix)
        self.slot_state[PREFIX].index_put_((self.slots,), grown)
        self.slot_state[BONUS].index_put_((self.slots,), self.next_bonus)
        self.slot_state[:, self.scratch_slot].zero_()

    def committed_rows(self) -> torch.Tensor:
        return self.decoder.committed_rows(self.tree, self.accepted, self.accept_len, self.next_bonus)


def placeholder_tree(rows: int, decoder: DDTreeDecoder) -> TreeBatch:
    """A valid tree per row on the decoder's device (equal log-probs, ids 0..K-1): what a padding
    row verifies until a real tree lands in its buffer."""
    shape = (rows, decoder.depth, decoder.top_k)
    ids = torch.arange(decoder.top_k, dtype=torch.int64).expand(shape)
    return build_tree_cpu(torch.zeros(shape), ids, decoder.budget).to(decoder.target.device)


@dataclass
class Launched:
    """A step launched and not yet landed: its bucket step, its requests (rows in order) and the
    pinned buffer (and event) its tokens go to."""

    step: BucketStep
    request_ids: list[Hashable]
    buffer: int


class StaticStep:
    """Runs `DDTreeDecoder`'s stages padded to buckets; `replay`, once engine/cuda_graphs.py set it,
    runs a recorded graph in place of a stage's eager code."""

    def __init__(self, decoder: DDTreeDecoder, n_slots: int, scratch_slot: int, nvtx: Nvtx, host_builder: bool):
        self.decoder, self.nvtx, self.host_builder = decoder, nvtx, host_builder
        self.buckets = batch_buckets(n_slots)
        self.padding = (scratch_slot, 0)  # one value per HOST_INPUTS row
        device = decoder.target.device
        pinned = device.type == "cuda"  # the host buffers the device copies to and from asynchronously
        biggest = self.buckets[-1]
        self.inputs = torch.zeros(len(INPUTS), biggest, dtype=torch.int64, device=device)
        self.slot_state = torch.zeros(2, scratch_slot + 1, dtype=torch.int64, device=device)
        # Two of each host buffer: step N+1 fills and sends while step N's may still be in use.
        self.staged_inputs = [torch.zeros(HOST_INPUTS, biggest, dtype=torch.int64, pin_memory=pinned)
                              for _ in range(2)]
        self.landed = [torch.zeros(biggest, decoder.depth + 2, dtype=torch.int64, pin_memory=pinned)
                       for _ in range(2)]
        self.landed_events = [torch.cuda.Event() if pinned else None for _ in range(2)]
        self.first_tokens = torch.zeros(scratch_slot + 1, dtype=torch.int64, pin_memory=pinned)
        self.first_events = [torch.cuda.Event() if pinned else None for _ in range(scratch_slot + 1)]
        self.bucket_steps = {b: BucketStep(decoder, self.inputs[:, :b], self.slot_state, scratch_slot, host_builder)
                             for b in self.buckets}
        self.replay: Callable[[int, str], None] | None = None
        self.launches = 0

    @property
    def graphed_stages(self) -> tuple[str, ...]:
        """The stages that are device work only: all but sampling, and tree_build with the CPU builder."""
        return (DRAFT, VERIFY, ACCEPT, KV_COMPACT) if self.host_builder else (DRAFT, TREE_BUILD, VERIFY, ACCEPT,
                                                                              KV_COMPACT)

    def admit(self, slot: int, prompt_len: int, first_token: torch.Tensor) -> None:
        """A prefilled request's slot state (prefix, bonus) on the device, and its first token on its
        way to the host (`first_token` reads it): no wait here, so admitting keeps the GPU busy."""
        self.slot_state[PREFIX, slot].fill_(prompt_len)  # a kernel; `x[i] = int` would copy from the host and wait
        self.slot_state[BONUS, slot].copy_(first_token.reshape(()))
        self.first_tokens[slot:slot + 1].copy_(first_token.reshape(1), non_blocking=True)
        self._record(self.first_events[slot])

    def first_token(self, slot: int) -> int:
        """The first token of the request admitted into `slot`, once on the host."""
        _wait_unless_done(self.first_events[slot])  # mostly done: the first commit landed after it
        return int(self.first_tokens[slot])

    def fill(self, columns: list[list[int]]) -> BucketStep:
        """Copy one value per request and HOST_INPUTS row into the input buffer, padded to a bucket."""
        bucket = bucket_for(self.buckets, len(columns[0]))
        buffer = self.launches % 2
        _wait_unless_done(self.landed_events[buffer])  # the step two launches back is done with both buffers
        staged = self.staged_inputs[buffer]
        padded = [column + [pad] * (bucket - len(column)) for column, pad in zip(columns, self.padding)]
        staged[:, :bucket] = torch.tensor(padded, dtype=torch.int64)
        # Row by row: a row's first `bucket` values are contiguous, so each copy goes straight from
        # pinned memory; a [rows, :bucket] block is not, and PyTorch would stage it through pageable
        # memory (a copy that may wait for the GPU).
        for row in range(HOST_INPUTS):
            self.inputs[row, :bucket].copy_(staged[row, :bucket], non_blocking=True)
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

    def launch(self, request_ids: list[Hashable], slots: list[int], seeds: list[int]) -> Launched:
        """draft .. kv_compact over these requests (their prefixes and bonus tokens: the device's)."""
        step = self.fill([slots, seeds])
        self.run_stages(step, len(slots))
        launched = Launched(step, request_ids, self.launches % 2)
        self.launches += 1
        return launched

    def send(self, launched: Launched) -> None:
        """The step's committed rows on their way to the host (inside `sampling`): no wait."""
        step = launched.step
        self.landed[launched.buffer][:step.slots.shape[0]].copy_(step.committed_rows(), non_blocking=True)
        self._record(self.landed_events[launched.buffer])

    def land(self, launched: Launched) -> list[list[int]]:
        """The step's committed rows on the host, one per request: the step's one wait."""
        if self.landed_events[launched.buffer] is not None:
            self.landed_events[launched.buffer].synchronize()
        return self.landed[launched.buffer][:len(launched.request_ids)].tolist()

    def _record(self, event: torch.cuda.Event | None) -> None:
        """Record on the engine's device's stream (the current device may be another GPU)."""
        if event is not None:
            event.record(torch.cuda.current_stream(self.inputs.device))


def _wait_unless_done(event: torch.cuda.Event | None) -> None:
    """Wait for `event` only if it is pending: a done one costs a query, not a call that ddprof
    counts as waiting for the GPU (the step's one wait stays `land`'s)."""
    if event is not None and not event.query():
        event.synchronize()
