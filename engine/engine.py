"""The serving API: admit requests into cache slots, step them all together, release them.

A scheduler drives it:

    engine = Engine(target, drafter, budget=8, builder="cpu", n_slots=32, max_len=512)
    if engine.can_admit(len(prompt), max_new): engine.admit("r1", prompt, max_new, eos_id)
    new_tokens = engine.step()          # {request_id: [tokens committed this step]}
    for rid in engine.finished(): result = engine.result(rid); engine.release(rid)

Each `step` is one NVTX range `step` holding the decode stages, followed by a `tokens` mark whose
payload is the number of tokens committed (whole batch); `admit` runs the prompt as a `prefill`
range, `admit_many` several prompts as one forward inside one `prefill` range. A request's tokens
never depend on what else is in the batch, nor on what it was prefilled with (see model.linear and
attention.tree_attention). `static_shapes` runs the static-shape step (engine/static_step.py),
`cuda_graphs` replays it as CUDA graphs recorded here, before any request (engine/cuda_graphs.py).
`overlap` (the static-shape step) launches step N+1 before step N's tokens reach the host: `step`
launches the next step, then lands and commits the one before, so the host applies stop rules and
the scheduler admits and evicts while the GPU runs. A request that stopped in step N was already in
step N+1 (the host did not know yet): that step's rows for it are discarded, and its slot is freed
only after, in stream order. Each `step` range then holds the new step's stages and, in `sampling`,
the previous step's commit; its `tokens` mark counts what that commit kept. With the CPU builder
the host runs ahead only up to draft: tree_build waits for the same step's top-k.
At `temperature` > 0 the target samples; each request's sample at a
position depends only on its seed and that position (engine/sampling.py), so DDTree still emits
exactly the autoregressive tokens.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import torch

from engine.cuda_graphs import GraphRecording, record_graphs, require_graphable
from engine.ddtree import SAMPLING, ARDecoder, DDTreeDecoder, DecodeBatch, StepResult, apply_stop_rules, commit
from engine.drafter import Drafter
from engine.errors import EngineError
from engine.host_to_device import int64_on
from engine.kv_cache import LatentKVCache
from engine.model import TargetModel
from engine.nvtx_ranges import Nvtx
from engine.sampling import MAX_SEED, MIN_TEMPERATURE, choose_tokens, valid_temperature
from engine.stages import PREFILL, STEP, TOKENS_MARK
from engine.static_step import Launched, StaticStep


def rows_per_slot(lengths: Iterable[tuple[int, int]], budget: int) -> int:
    """Cache rows a slot needs to hold any of these requests, given as (prompt tokens, answer
    tokens): the prompt, the answer, and the bonus plus `budget` tree rows one step writes past it."""
    return max(prompt + answer for prompt, answer in lengths) + 1 + budget


@dataclass
class Request:
    slot: int
    max_new_tokens: int
    eos_id: int | None
    seed: int
    prefix_len: int = 0  # committed rows in the cache
    bonus: int = 0  # the last emitted token, not yet in the cache
    tokens: list[int] = field(default_factory=list)  # emitted so far
    target_forwards: int = 0  # prefill + steps taken part in
    accept_lengths: list[int] = field(default_factory=list)
    done: bool = False
    first_pending: bool = True  # the prefill's first token is not on the host yet (static-shape step)


@dataclass(frozen=True)
class Admission:
    """One request to admit: `Engine.admit`'s arguments, so several can be admitted as one batch."""

    request_id: Hashable
    prompt_tokens: list[int]
    max_new_tokens: int
    eos_id: int | None = None
    seed: int | None = None


@dataclass
class RequestResult:
    tokens: list[int]
    target_forwards: int
    accept_lengths: list[int]


class Engine:
    def __init__(self, model: TargetModel, drafter: Drafter | None, *, budget: int, builder: str = "cpu",
                 mode: str = "ddtree", n_slots: int, max_len: int, device: str | torch.device | None = None,
                 nvtx: bool = True, temperature: float = 0.0, static_shapes: bool = False, cuda_graphs: bool = False,
                 overlap: bool = False):
        if mode not in ("ddtree", "ar"):
            raise EngineError(f"unknown decoding mode {mode!r}; choose ddtree or ar")
        if mode == "ddtree" and drafter is None:
            raise EngineError("ddtree decoding needs a drafter")
        if budget < 1:
            raise EngineError(f"budget must be at least 1, got {budget}")
        if not valid_temperature(temperature):
            raise EngineError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {temperature}")
        lookahead = drafter.config.block_size if drafter is not None else 1
        if max_len + lookahead > model.config.max_position_embeddings:
            raise EngineError(f"max_len {max_len} (+{lookahead} lookahead) exceeds the model's "
                              f"max_position_embeddings {model.config.max_position_embeddings}")
        self.device = torch.device(device) if device is not None else model.device
        if cuda_graphs:
            require_graphable(self.device.type, mode)
        if overlap and mode != "ddtree":
            raise EngineError("--overlap: only for --mode ddtree (it runs the static-shape step, DDTree's)")
        static_shapes = static_shapes or cuda_graphs or overlap  # graphs replay, overlap reorders the static step
        if static_shapes and mode != "ddtree":
            raise EngineError("the static-shape step: only for ddtree decoding")
        if self.device.type == "cuda" and self.device.index is None:  # "cuda" means the current GPU
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device != model.device:
            raise EngineError(f"the model is on {model.device}, not on the engine's device {self.device}")
        self.model, self.mode, self.budget, self.temperature = model, mode, budget, temperature
        self.nvtx = Nvtx(nvtx)
        if model.parallel is not None:  # its all-reduce ranges nest in this engine's stages, switched with them
            model.parallel.nvtx = self.nvtx
        self.cache = LatentKVCache(model.config.num_hidden_layers, n_slots, max_len, model.config.latent_dim,
                                   dtype=model.dtype, device=self.device, scratch_slots=int(static_shapes))
        if mode == "ddtree":
            self.decoder = DDTreeDecoder(model, drafter, self.cache, budget=budget, builder=builder, nvtx=self.nvtx,
                                         temperature=temperature)
        else:
            self.decoder = ARDecoder(model, self.cache, self.nvtx, temperature=temperature)
        # The static-shape step (engine/static_step.py), its padding rows in the scratch slot after n_slots.
        self.static_step = StaticStep(self.decoder, n_slots, n_slots, self.nvtx, builder == "cpu") \
            if static_shapes else None
        # What recording the CUDA graphs took (engine/cuda_graphs.py), before any request.
        self.graphs: GraphRecording | None = record_graphs(self.static_step) if cuda_graphs else None
        self.block_rows = 1 + budget if mode == "ddtree" else 1  # rows one step writes past the prefix
        self.requests: dict[Hashable, Request] = {}
        self.overlap = overlap
        self.in_flight: Launched | None = None  # with overlap: the step launched and not yet committed

    @property
    def active(self) -> int:
        """Requests still decoding (admitted, not finished)."""
        return sum(not r.done for r in self.requests.values())

    def can_admit(self, prompt_len: int, max_new_tokens: int, after: int = 0) -> bool:
        """A free slot, with room for the prompt, every new token and one step's block, once `after`
        requests admitted with it (one batch) took a slot each."""
        return self.cache.n_free > after and self.cache.can_hold(prompt_len + max_new_tokens + self.block_rows)

    def admit(self, request_id: Hashable, prompt_tokens: list[int], max_new_tokens: int,
              eos_id: int | None = None, seed: int | None = None) -> None:
        """Prefill the prompt into a fresh slot; its first new token is emitted right away (with the
        static-shape step: at the request's first commit, so that admitting never waits for the GPU).

        `seed` (0 <= seed < 2**32) fixes the request's samples at temperature > 0; by default it is
        derived from the request id, so a request decodes the same way in any batch.
        """
        self.admit_many([Admission(request_id, prompt_tokens, max_new_tokens, eos_id, seed)])

    @torch.no_grad()
    def admit_many(self, admissions: list[Admission]) -> None:
        """`admit` for several requests, their prompts prefilled in one forward (one `prefill`
        range; `TargetModel.prefill_many`): each request's tokens are those it gets admitted alone.
        Every request is checked before any is admitted, so a refused batch admits none."""
        if not admissions:
            return
        seeds = [self._checked_seed(a, admissions[:index]) for index, a in enumerate(admissions)]
        slots = [self.cache.allocate() for _ in admissions]
        prompt_lens = [len(a.prompt_tokens) for a in admissions]
        with self.nvtx.range(PREFILL):
            prompts = [int64_on(a.prompt_tokens, self.device) for a in admissions]
            logits, features = self.model.prefill_many(prompts, self.cache.kv, slots, self.decoder.feature_layers)
            for slot, prompt_features in zip(slots, features or [None] * len(slots)):
                self.decoder.after_prefill(slot, prompt_features)
            firsts = choose_tokens(logits, self._tensor(prompt_lens), self._tensor(seeds), self.temperature)
            if self.static_step is not None:  # the first tokens reach the host at the requests' first commit
                for i, slot in enumerate(slots):
                    self.static_step.admit(slot, prompt_lens[i], firsts[i])
        emitted = firsts.tolist() if self.static_step is None else None
        for i, (admission, slot, seed) in enumerate(zip(admissions, slots, seeds)):
            request = Request(slot, admission.max_new_tokens, admission.eos_id, seed, prefix_len=prompt_lens[i],
                              target_forwards=1)
            self.requests[admission.request_id] = request
            if emitted is not None:
                self._emit_first(request, emitted[i])

    def _checked_seed(self, admission: Admission, earlier: list[Admission]) -> int:
        """The request's seed, once it passes `admit`'s checks after the `earlier` requests of its
        batch (each of which takes a free slot)."""
        request_id, prompt_tokens, max_new_tokens = admission.request_id, admission.prompt_tokens, admission.max_new_tokens
        if request_id in self.requests:
            raise EngineError(f"request {request_id!r} is already admitted")
        if any(a.request_id == request_id for a in earlier):
            raise EngineError(f"request {request_id!r} appears twice in one admission")
        if not prompt_tokens or max_new_tokens < 1:
            raise EngineError(f"request {request_id!r}: needs a non-empty prompt and max_new_tokens >= 1")
        if not self.can_admit(len(prompt_tokens), max_new_tokens, after=len(earlier)):
            raise EngineError(f"request {request_id!r}: no free slot with {len(prompt_tokens) + max_new_tokens + self.block_rows} "
                              f"rows (max_len {self.cache.max_len}, {self.cache.n_free - len(earlier)} slots free)")
        seed = zlib.crc32(repr(request_id).encode()) if admission.seed is None else admission.seed
        if not 0 <= seed < MAX_SEED:
            raise EngineError(f"request {request_id!r}: seed must be in [0, 2**32), got {seed}")
        return seed

    def _emit_first(self, request: Request, first: int) -> None:
        request.bonus, request.first_pending = first, False
        request.tokens = apply_stop_rules([first], request.max_new_tokens, request.eos_id)
        request.done = self._is_done(request)

    @torch.no_grad()
    def step(self) -> dict[Hashable, list[int]]:
        """One batched decode step over every active request: {request_id: tokens committed}. With
        `overlap`, the tokens are those of the step launched by the call before (none at first)."""
        ids = [rid for rid, r in self.requests.items() if not r.done]
        if not ids:
            return {}
        if self.static_step is not None:
            return self._static_step(ids)
        requests = [self.requests[rid] for rid in ids]
        columns = [[r.slot for r in requests], [r.prefix_len for r in requests], [r.bonus for r in requests],
                   [r.seed for r in requests]]
        remaining = [r.max_new_tokens - len(r.tokens) for r in requests]
        eos_ids = [r.eos_id for r in requests]
        with self.nvtx.range(STEP):
            result = self.decoder.step(DecodeBatch(*(self._tensor(c) for c in columns), remaining, eos_ids))
        self.nvtx.mark(TOKENS_MARK, sum(len(t) for t in result.committed))
        self._apply(requests, result)
        return dict(zip(ids, result.committed))

    def _static_step(self, ids: list[Hashable]) -> dict[Hashable, list[int]]:
        """Launch a step over `ids`, send its tokens, then land and commit the step before (overlap)
        or this one: the same work in either order."""
        requests = [self.requests[rid] for rid in ids]
        with self.nvtx.range(STEP):
            launched = self.static_step.launch(ids, [r.slot for r in requests], [r.seed for r in requests])
            with self.nvtx.range(SAMPLING):
                self.static_step.send(launched)
                landing, self.in_flight = (self.in_flight, launched) if self.overlap else (launched, None)
                committed = self._commit(landing) if landing is not None else {}
        self.nvtx.mark(TOKENS_MARK, sum(len(t) for t in committed.values()))
        if not self.active:  # every request stopped: the step in flight has nothing to keep
            self.in_flight = None
        return committed

    def _commit(self, landed: Launched) -> dict[Hashable, list[int]]:
        """A landed step's tokens under the stop rules, for its requests that had not stopped before
        it (the rows of those that had are discarded)."""
        rows = self.static_step.land(landed)
        kept_ids, kept_rows = [], []
        for rid, row in zip(landed.request_ids, rows):
            request = self.requests.get(rid)
            if request is not None and request.first_pending:
                self._emit_first(request, self.static_step.first_token(request.slot))
            if request is not None and not request.done:
                kept_ids.append(rid)
                kept_rows.append(row)
        requests = [self.requests[rid] for rid in kept_ids]
        result = commit(kept_rows, [r.max_new_tokens - len(r.tokens) for r in requests], [r.eos_id for r in requests])
        self._apply(requests, result)
        return dict(zip(kept_ids, result.committed))

    def _apply(self, requests: list[Request], result: StepResult) -> None:
        """A step's result into its requests' host state."""
        for i, request in enumerate(requests):
            request.tokens += result.committed[i]
            request.prefix_len += result.rows_added[i]
            request.bonus = result.next_bonus[i]
            request.target_forwards += 1
            if result.accept_lens is not None:
                request.accept_lengths.append(result.accept_lens[i])
            request.done = self._is_done(request)

    def finished(self) -> list[Hashable]:
        """Requests that are done and still hold their slot."""
        return [rid for rid, r in self.requests.items() if r.done]

    def result(self, request_id: Hashable) -> RequestResult:
        r = self._request(request_id)
        return RequestResult(list(r.tokens), r.target_forwards, list(r.accept_lengths))

    def release(self, request_id: Hashable) -> None:
        """Forget the request and free its slot."""
        self.cache.release(self._request(request_id).slot)
        del self.requests[request_id]

    def _request(self, request_id: Hashable) -> Request:
        if request_id not in self.requests:
            raise EngineError(f"unknown request {request_id!r}")
        return self.requests[request_id]

    def _tensor(self, values: list[int] | int) -> torch.Tensor:
        return int64_on(values, self.device)

    @staticmethod
    def _is_done(request: Request) -> bool:
        hit_eos = request.eos_id is not None and request.tokens[-1:] == [request.eos_id]
        return hit_eos or len(request.tokens) >= request.max_new_tokens
