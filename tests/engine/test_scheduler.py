"""Continuous batching: batch-independent tokens, admission control, requests that end at prefill."""

import pytest
import torch

from engine.engine import Engine
from engine.errors import EngineError
from engine import scheduler
from engine.scheduler import Request, serve
from engine.tokenizer import load_tokenizer
from engine.trained import load_pair
from engine.workloads import generate

TOKENIZER = load_tokenizer()
BUDGET = 6
MAX_LEN = 200


def chat_requests(count):
    """Real chat prompts, with prompts and answers cut short (and varied) so 32 decode in seconds."""
    return [Request(r.request_id, r.prompt_tokens[:24 + (5 * r.request_id) % 60], 3 + (7 * r.request_id) % 12)
            for r in generate("chat", count, seed=11, tokenizer=TOKENIZER)]


def make_engine(pair, n_slots):
    target, drafter = pair
    return Engine(target, drafter, budget=BUDGET, n_slots=n_slots, max_len=MAX_LEN, nvtx=False)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """As `serve` runs on the CPU: one torch thread (more stall on the shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained_tiny():
    """The committed trained tiny pair: its drafter is often right, so steps accept whole paths."""
    return load_pair("tiny")


class Recording:
    """The real engine, plus a record of how many requests each step advanced and what they accepted."""

    def __init__(self, engine):
        self.engine, self.step_sizes, self.accept_lengths = engine, [], []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        self.step_sizes.append(self.engine.active)
        return self.engine.step()

    def result(self, request_id):
        done = self.engine.result(request_id)
        self.accept_lengths += done.accept_lengths
        return done


@pytest.fixture(scope="module")
def batch_of_32(trained_tiny):
    requests = chat_requests(32)
    engine = Recording(make_engine(trained_tiny, n_slots=32))
    return requests, engine, serve(engine, requests, concurrency=32, eos_id=TOKENIZER.eos_id)


def test_a_request_alone_yields_the_tokens_it_yields_inside_a_batch_of_32(trained_tiny, batch_of_32):
    requests, engine, batched = batch_of_32
    assert max(engine.step_sizes) == 32
    assert max(engine.accept_lengths) >= 2  # multi-token accepted paths were compacted inside the batch
    for request in requests[::5]:
        alone = serve(make_engine(trained_tiny, n_slots=1), [request], concurrency=1, eos_id=TOKENIZER.eos_id)
        assert alone.tokens[request.request_id] == batched.tokens[request.request_id]


def test_continuous_batching_with_joins_and_leaves_yields_the_same_tokens(trained_tiny, batch_of_32):
    requests, _, batched = batch_of_32
    finished = []
    engine = Recording(make_engine(trained_tiny, n_slots=32))
    rolling = serve(engine, requests, concurrency=5, eos_id=TOKENIZER.eos_id,
                    on_finished=lambda request_id, tokens: finished.append(request_id))
    assert rolling.tokens == batched.tokens
    assert max(engine.step_sizes) == 5 and sorted(finished) == list(range(32))
    assert finished != list(range(32))  # answer lengths differ, so requests leave out of order


def test_counts_add_up(batch_of_32):
    requests, engine, result = batch_of_32
    for request in requests:
        tokens = result.tokens[request.request_id]
        assert 1 <= len(tokens) <= request.max_new_tokens
        assert len(tokens) == request.max_new_tokens or tokens[-1] == TOKENIZER.eos_id
    assert result.steps == len(engine.step_sizes)
    assert result.first_tokens == len(requests)  # each request's first token comes from its prefill
    assert result.step_tokens + result.first_tokens == result.generated_tokens


def test_a_full_cache_makes_requests_wait_instead_of_failing(trained_tiny, batch_of_32):
    requests, _, batched = batch_of_32
    engine = Recording(make_engine(trained_tiny, n_slots=3))  # room for 3, concurrency asks for 32
    result = serve(engine, requests[:10], concurrency=32, eos_id=TOKENIZER.eos_id)
    assert max(engine.step_sizes) == 3
    assert result.tokens == {r.request_id: batched.tokens[r.request_id] for r in requests[:10]}
    assert engine.cache.n_free == 3


def test_requests_that_end_at_prefill_leave_without_a_step(trained_tiny):
    requests = [Request(i, [TOKENIZER.bos_id, 72, 105 + i], max_new_tokens=1) for i in range(4)]
    engine = Recording(make_engine(trained_tiny, n_slots=2))
    result = serve(engine, requests, concurrency=2)
    assert engine.step_sizes == [] and result.steps == 0
    assert [len(result.tokens[i]) for i in range(4)] == [1, 1, 1, 1]


def test_a_request_larger_than_the_cache_is_an_error_not_a_hang(trained_tiny):
    engine = make_engine(trained_tiny, n_slots=2)
    too_long = Request(0, [TOKENIZER.bos_id] * (MAX_LEN - 5), max_new_tokens=10)
    with pytest.raises(EngineError, match="request 0 .* does not fit in an empty KV cache"):
        serve(engine, [too_long], concurrency=2)


def test_the_host_seconds_split_into_prefills_and_steps(trained_tiny, monkeypatch):
    """Each prefill's and each step's host time lands in its own sum: on a clock that ticks one
    second per reading, each one counts one second."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(scheduler.time, "perf_counter", lambda: float(next(ticks)))
    result = serve(make_engine(trained_tiny, n_slots=4), chat_requests(6), concurrency=4, eos_id=TOKENIZER.eos_id,
                   prefill_tokens=0)
    assert result.prefills == 6 and result.prefill_s == 6.0
    assert result.steps > 0 and result.step_s == float(result.steps)
