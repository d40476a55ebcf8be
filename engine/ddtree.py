"""One batched decode step, in the six NVTX stages ddprof attributes time to.

DDTree (Ringel & Romano, 2026), per step and for every request in the batch at once:

    draft       the drafter's one forward over [bonus, MASK x L] -> per-depth top-K log-probs
    tree_build  the top-`budget` prefixes as a tree (CPU heapq, or the GPU builder)
    verify      one target forward over [bonus, nodes...] at positions prefix_len + depth,
                each node seeing the prefix, the bonus and its own ancestors
    accept      walk the tree along the target's choices (argmax, or its seeded sample: engine/sampling.py)
    kv_compact  move the accepted rows behind the bonus row; keep their features for the drafter
    sampling    the next bonus token (the target's choice after the accepted path); commit the
                step's tokens to the host under each request's stop rules

`ARDecoder` is the plain autoregressive baseline DDTree is lossless against (stages verify and
sampling only), greedy or sampled: both decoders choose tokens with `engine.sampling.choose_tokens`,
whose sample at a position depends only on the request's seed and that position. Both take a `DecodeBatch` and return a `StepResult`; `engine.Engine` owns the
requests, the NVTX `step` range around a step and the `tokens` mark after it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.accept import accept_greedy
from engine.drafter import Drafter, DrafterCache, propose
from engine.errors import EngineError
from engine.kv_cache import LatentKVCache
from engine.model import TargetModel
from engine.nvtx_ranges import Nvtx
from engine.sampling import choose_tokens
from engine.stages import STAGES
from engine.tree import TreeBatch, build_tree_cpu

DRAFT, TREE_BUILD, VERIFY, ACCEPT, KV_COMPACT, SAMPLING = STAGES


@dataclass
class DecodeBatch:
    """The requests of one step, one entry each (device tensors), plus their host-side stop rules."""

    slots: torch.Tensor  # [bs] int64
    prefix_lens: torch.Tensor  # [bs] int64: committed rows in the cache (the bonus is not among them)
    bonus: torch.Tensor  # [bs] int64: the last committed token, not yet in the cache
    seeds: torch.Tensor  # [bs] int64: each request's sampling seed (unused at temperature 0)
    remaining: list[int]  # tokens each request may still emit
    eos_ids: list[int | None]


@dataclass
class StepResult:
    committed: list[list[int]]  # tokens emitted per request this step, after the stop rules
    rows_added: list[int]  # rows appended to each request's cache (bonus + accepted nodes)
    next_bonus: list[int]
    accept_lens: list[int] | None  # draft tokens accepted per request (None for AR decoding)


def apply_stop_rules(tokens: list[int], remaining: int, eos_id: int | None) -> list[int]:
    """Keep at most `remaining` tokens, and nothing after an end-of-sequence token."""
    tokens = tokens[:remaining]
    if eos_id is not None and eos_id in tokens:
        tokens = tokens[:tokens.index(eos_id) + 1]
    return tokens


def tree_builder(name: str, device: torch.device):
    """The tree builder behind `--builder`: "cpu" (heapq reference) or "gpu" (the Triton builder)."""
    if name == "cpu":
        return build_tree_cpu
    if name == "gpu":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise EngineError(f"--builder gpu runs a Triton kernel: it needs a CUDA device (the engine is on {device}) "
                              "or TRITON_INTERPRET=1 for Triton's CPU interpreter")
        from triton_kernels.tree_build import build_tree_gpu

        return build_tree_gpu
    raise EngineError(f"unknown tree builder {name!r}; choose cpu or gpu")


def checked_tree_builder(name: str, device: torch.device, budget: int, depth: int):
    """`tree_builder`, refusing a budget the chosen builder cannot build at this drafter depth, in one
    line and before any work (the GPU builder's rank-path keys are one int64)."""
    build = tree_builder(name, device)
    if name == "gpu":
        from triton_kernels.tree_build import KEY_BITS

        if budget + min(depth, budget) > KEY_BITS:
            raise EngineError(f"--builder gpu: budget {budget} at drafter depth {depth} needs budget + min(depth, "
                              f"budget) <= {KEY_BITS} (the GPU builder's rank-path keys); lower --budget or use "
                              "--builder cpu")
    return build


def block_mask(tree: TreeBatch) -> torch.Tensor:
    """[bs, 1 + B, 1 + B] verify mask over [bonus, nodes...]: everyone sees the bonus (root);
    node i sees its ancestors and itself; the bonus sees only itself."""
    bs, budget = tree.token_ids.shape
    mask = torch.zeros(bs, budget + 1, budget + 1, dtype=torch.bool, device=tree.token_ids.device)
    mask[:, :, 0] = True
    mask[:, 1:, 1:] = tree.visibility
    return mask


class ARDecoder:
    """Plain autoregressive decoding: one target forward per token."""

    def __init__(self, target: TargetModel, cache: LatentKVCache, nvtx: Nvtx, *, temperature: float = 0.0):
        self.target, self.cache, self.nvtx, self.temperature = target, cache, nvtx, temperature
        self.feature_layers: tuple[int, ...] = ()

    def after_prefill(self, slot: int, features: torch.Tensor | None) -> None:
        """Nothing to prepare: AR decoding has no drafter."""

    def step(self, batch: DecodeBatch) -> StepResult:
        bs = batch.slots.shape[0]
        with self.nvtx.range(VERIFY):
            plain = torch.ones(bs, 1, 1, dtype=torch.bool, device=batch.slots.device)
            logits, _ = self.target.forward_block(batch.bonus[:, None], batch.prefix_lens[:, None], self.cache.kv,
                                                  batch.slots, batch.prefix_lens, plain)
            next_token = choose_tokens(logits[:, 0], batch.prefix_lens + 1, batch.seeds, self.temperature)
        with self.nvtx.range(SAMPLING):
            tokens = next_token.tolist()
            committed = [apply_stop_rules([t], r, e) for t, r, e in zip(tokens, batch.remaining, batch.eos_ids)]
        return StepResult(committed, [1] * bs, tokens, None)


class DDTreeDecoder:
    """DDTree decoding with a block drafter and a draft tree of `budget` nodes."""

    def __init__(self, target: TargetModel, drafter: Drafter, cache: LatentKVCache, *, budget: int, builder: str,
                 nvtx: Nvtx, temperature: float = 0.0):
        self.target, self.drafter, self.cache, self.nvtx = target, drafter, cache, nvtx
        self.temperature = temperature
        self.budget = budget
        self.depth = drafter.config.depth
        self.build_tree = checked_tree_builder(builder, target.device, budget, self.depth)
        self.top_k = min(budget, target.config.vocab_size)  # K = budget, as the paper's code
        self.feature_layers = drafter.config.target_layer_ids
        slots_with_scratch, max_len = cache.kv.shape[1], cache.max_len
        # The drafter's context rows; the pending step's rows may land up to a block past max_len.
        self.drafter_cache = DrafterCache(drafter, slots_with_scratch, max_len + drafter.config.block_size)
        # Features of the tokens committed by each slot's last step, not yet in the drafter's cache.
        width = target.config.hidden_size * len(self.feature_layers)
        self.pending = torch.zeros(slots_with_scratch, self.depth + 1, width, dtype=target.dtype, device=target.device)
        self.pending_count = torch.zeros(slots_with_scratch, dtype=torch.int64, device=target.device)

    def after_prefill(self, slot: int, features: torch.Tensor) -> None:
        """The prompt's features become the drafter's context for this slot."""
        n = features.shape[0]
        # torch.full and zero_ are kernels: a host list or `x[i] = 0` would copy from the host and wait.
        self.drafter_cache.append(self.drafter, torch.full((1,), slot, device=features.device), features[None],
                                  torch.arange(n, device=features.device)[None])
        self.pending_count[slot].zero_()

    # The stages, as device work only (engine/static_step.py runs them on fixed shapes, in CUDA graphs).

    def draft(self, slots: torch.Tensor, prefix_lens: torch.Tensor, bonus: torch.Tensor,
              context_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The pending features into the drafter's cache, then its proposal: top-k log-probs and ids [bs, L, K]."""
        count = self.pending_count[slots]
        # Rows past `count` land at positions >= prefix_len: masked now, overwritten later. The clamp
        # only matters for a static step's padding rows (prefix 0): a request's prefix holds its count.
        positions = (prefix_lens - count).clamp(min=0)[:, None] + torch.arange(self.depth + 1, device=slots.device)
        self.drafter_cache.append(self.drafter, slots, self.pending[slots], positions)
        return propose(self.drafter, self.target, self.drafter_cache, slots, prefix_lens, bonus, self.top_k,
                       context_rows=context_rows)

    def verify(self, tree: TreeBatch, slots: torch.Tensor, prefix_lens: torch.Tensor, bonus: torch.Tensor,
               seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One target forward over [bonus, nodes...]: the target's choice after each [bs, 1 + B] and the features."""
        tokens = torch.cat([bonus[:, None], tree.token_ids], dim=1)
        depths = torch.cat([torch.zeros_like(tree.depths[:, :1]), tree.depths], dim=1)
        positions = prefix_lens[:, None] + depths
        logits, features = self.target.forward_block(tokens, positions, self.cache.kv, slots, prefix_lens,
                                                     block_mask(tree), self.feature_layers)
        # The target's choice after each node: the token at the node's position + 1.
        return choose_tokens(logits, positions + 1, seeds[:, None], self.temperature), features

    def accept(self, tree: TreeBatch, target_choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """accepted [bs, L] (-1 padded), accept_len [bs], next_bonus [bs]."""
        if target_choice.is_cuda:  # the Triton walk (triton_kernels/tree_accept.py), same outputs
            from triton_kernels.tree_accept import tree_accept
            return tree_accept(tree, target_choice, self.depth)
        return accept_greedy(tree, target_choice, self.depth)

    def compact(self, slots: torch.Tensor, prefix_lens: torch.Tensor, accepted: torch.Tensor,
                accept_len: torch.Tensor, features: torch.Tensor) -> None:
        """The accepted rows behind the bonus row; their features pending for the next draft."""
        self.cache.compact(slots, prefix_lens, accepted, accept_len)
        # The bonus and the accepted nodes (block rows 0 and 1 + accepted) condition the next draft.
        kept_rows = torch.cat([torch.zeros_like(accepted[:, :1]), 1 + accepted.clamp(min=0)], dim=1)
        self.pending[slots] = features.gather(1, kept_rows[..., None].expand(-1, -1, features.shape[-1]))
        self.pending_count[slots] = 1 + accept_len

    @staticmethod
    def committed_rows(tree: TreeBatch, accepted: torch.Tensor, accept_len: torch.Tensor, next_bonus: torch.Tensor
                       ) -> torch.Tensor:
        """[bs, L + 2] int64: the accepted path's tokens (L, valid up to accept_len), the next bonus, accept_len."""
        path_tokens = tree.token_ids.gather(1, accepted.clamp(min=0))
        return torch.cat([path_tokens, next_bonus[:, None], accept_len[:, None]], dim=1)

    def step(self, batch: DecodeBatch) -> StepResult:
        slots, prefix_lens = batch.slots, batch.prefix_lens
        with self.nvtx.range(DRAFT):
            top_log_probs, top_token_ids = self.draft(slots, prefix_lens, batch.bonus)
        with self.nvtx.range(TREE_BUILD):
            tree = self.build_tree(top_log_probs, top_token_ids, self.budget).to(slots.device)
        with self.nvtx.range(VERIFY):
            target_choice, features = self.verify(tree, slots, prefix_lens, batch.bonus, batch.seeds)
        with self.nvtx.range(ACCEPT):
            accepted, accept_len, next_bonus = self.accept(tree, target_choice)
        with self.nvtx.range(KV_COMPACT):
            self.compact(slots, prefix_lens, accepted, accept_len, features)
        with self.nvtx.range(SAMPLING):
            rows = self.committed_rows(tree, accepted, accept_len, next_bonus).tolist()
            return commit(rows, batch.remaining, batch.eos_ids)


def commit(rows: list[list[int]], remaining: list[int], eos_ids: list[int | None]) -> StepResult:
    """The step's result from its `committed_rows` on the host, under each request's stop rules."""
    committed = [apply_stop_rules(row[:row[-1]] + row[-2:-1], r, e) for row, r, e in zip(rows, remaining, eos_ids)]
    lengths = [row[-1] for row in rows]
    return StepResult(committed, [1 + n for n in lengths], [row[-2] for row in rows], lengths)
