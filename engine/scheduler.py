"""Continuous batching with admission control over the Engine's serving API.

Requests wait in a FIFO queue. Before every decode step the scheduler admits (prefills) queued
requests while fewer than `concurrency` are in flight and the engine's KV cache has room for the
next one; when it has none, the queue waits -- the cache is never over-committed. The requests
admitted before a step are prefilled in batches (`Engine.admit_many`: one forward each) of at most
`prefill_tokens` prompt tokens; a longer prompt is prefilled alone, and 0 prefills one at a time. One
`engine.step()` then advances every request in flight by one batched decode step; requests that
finished (EOS or their token budget) leave and free their slot for the queue.

The queue is strictly first-come-first-served (no request overtakes a waiting one), so the order
of admissions is a pure function of the requests and the engine's capacity.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.errors import EngineError
from engine.serve_defaults import DEFAULT_PREFILL_TOKENS


@dataclass(frozen=True)
class Request:
    """One generation request: a tokenised prompt and at most how many tokens to generate."""

    request_id: int
    prompt_tokens: list[int]
    max_new_tokens: int


@dataclass
class ServeResult:
    """What a serving run produced, counted the way the trace counts it.

    `step_tokens` is what the decode steps committed (the sum of the `tokens` NVTX marks);
    each request's first token comes from its prefill, so `first_tokens` are counted apart (not to be
    confused with serve's `prefill_tokens`, the prompt tokens one batched prefill may hold).
    """

    tokens: dict[int, list[int]] = field(default_factory=dict)  # request id -> every token generated
    target_forwards: int = 0  # prefills + per-request decode steps
    steps: int = 0
    prefills: int = 0  # prefill forwards (batches of requests admitted together)
    step_tokens: int = 0
    # Host seconds inside the decode steps: a step returns its committed tokens, so it has waited for
    # their GPU work (overlapped: the step before's, while its own runs); what serving spends on
    # prefills and bookkeeping is the rest of the wall.
    step_s: float = 0.0
    # Host seconds inside the prefills (admit_many): the host's own work (the model's Python and its
    # launches) where the first tokens stay on the device (the graphed static step), else also the
    # wait for them.
    prefill_s: float = 0.0

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    @property
    def first_tokens(self) -> int:
        return self.generated_tokens - self.step_tokens


def serve(engine, requests: Iterable[Request], concurrency: int, *, eos_id: int | None = None,
          on_finished: Callable[[int, list[int]], None] | None = None,
          prefill_tokens: int = DEFAULT_PREFILL_TOKENS) -> ServeResult:
    """Run `requests` to completion through `engine` (an engine.engine.Engine).

    `on_finished(request_id, tokens)` is called as each request leaves the batch.
    """
    from engine.engine import Admission  # here: engine.engine loads torch, which `serve --check` never needs

    if concurrency < 1:
        raise EngineError(f"concurrency must be at least 1 (got {concurrency})")
    if prefill_tokens < 0:
        raise EngineError(f"prefill tokens must be at least 0 (got {prefill_tokens})")
    queue = deque(requests)
    result = ServeResult()
    while queue or engine.active:
        admitted = 0
        while batch := _prefill_batch(engine, queue, concurrency, prefill_tokens):
            start = time.perf_counter()
            engine.admit_many([Admission(r.request_id, r.prompt_tokens, r.max_new_tokens, eos_id) for r in batch])
            result.prefill_s += time.perf_counter() - start
            admitted += len(batch)
            result.prefills += 1
        if engine.active:
            start = time.perf_counter()
            committed = engine.step()
            result.step_s += time.perf_counter() - start
            result.steps += 1
            result.step_tokens += sum(len(tokens) for tokens in committed.values())
        elif not admitted:
            head = queue[0]
            raise EngineError(f"request {head.request_id} ({len(head.prompt_tokens)} prompt + "
                              f"{head.max_new_tokens} new tokens) does not fit in an empty KV cache")
        for request_id in engine.finished():  # also those done at prefill (EOS or max_new_tokens 1)
            done = engine.result(request_id)
            engine.release(request_id)
            result.tokens[request_id] = done.tokens
            result.target_forwards += done.target_forwards
            if on_finished:
                on_finished(request_id, done.tokens)
    return result


def _prefill_batch(engine, queue: deque[Request], concurrency: int, prefill_tokens: int) -> list[Request]:
    """The queue's next requests that fit in flight and in the cache, taken off the queue: as many
    as `prefill_tokens` prompt tokens hold, and always the first one (a prompt longer than the budget
    is prefilled alone)."""
    batch: list[Request] = []
    tokens = 0
    while queue and engine.active + len(batch) < concurrency and engine.can_admit(
            len(queue[0].prompt_tokens), queue[0].max_new_tokens, after=len(batch)):
        if batch and tokens + len(queue[0].prompt_tokens) > prefill_tokens:
            break
        tokens += len(queue[0].prompt_tokens)
        batch.append(queue.popleft())
    return batch
