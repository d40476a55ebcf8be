"""The serving API: admission and capacity, stepping, stop rules, release (the NVTX sequence is checked
on real nsys captures: test_nvtx_nsys.py)."""

import pytest

from engine.engine import Engine
from engine.errors import EngineError

PROMPT = [256, 72, 101, 108, 108, 111]


@pytest.fixture(scope="module")
def models(trained):
    """The trained pair: its drafts are often accepted, so slot reuse and mid-flight admission are
    checked with accepted rows really moving in the cache."""
    return trained


def make(models, **kwargs):
    target, drafter = models
    options = dict(budget=4, n_slots=2, max_len=64, nvtx=False) | kwargs
    return Engine(target, drafter, **options)


def run_alone(models, prompt, max_new, **kwargs):
    engine = make(models, **kwargs)
    engine.admit("r", prompt, max_new)
    while engine.active:
        engine.step()
    return engine.result("r").tokens


def test_capacity_and_admission_errors(models):
    engine = make(models)
    assert engine.can_admit(64 - 10 - 5, 10) and not engine.can_admit(64 - 10 - 4, 10)  # prompt + new + 1 + budget
    engine.admit("a", PROMPT, 10)
    with pytest.raises(EngineError, match="already admitted"):
        engine.admit("a", PROMPT, 10)
    engine.admit("b", PROMPT, 10)
    assert not engine.can_admit(1, 1)  # both slots taken
    with pytest.raises(EngineError, match="no free slot"):
        engine.admit("c", PROMPT, 10)
    with pytest.raises(EngineError, match="non-empty prompt"):
        make(models).admit("d", [], 10)


def test_step_finish_release_and_slot_reuse(models):
    engine = make(models)
    engine.admit("a", PROMPT, 12)
    first = engine.result("a").tokens
    assert len(first) == 1 and engine.active == 1 and engine.finished() == []
    emitted = list(first)
    while engine.active:
        new = engine.step()
        assert set(new) == {"a"} and len(new["a"]) >= 1
        emitted += new["a"]
    assert engine.finished() == ["a"] and engine.step() == {}
    assert emitted == engine.result("a").tokens and len(emitted) == 12
    engine.release("a")
    with pytest.raises(EngineError, match="unknown request"):
        engine.result("a")
    # The freed slot still holds a's rows; a new request in it is unaffected.
    assert run_alone(models, PROMPT[:3], 9, mode="ar") == _decode_in(engine, PROMPT[:3], 9)


def _decode_in(engine, prompt, max_new):
    engine.admit("again", prompt, max_new)
    while engine.active:
        engine.step()
    return engine.result("again").tokens


def test_request_admitted_mid_flight_matches_decoding_alone(models):
    engine = make(models, n_slots=3, max_len=96)
    engine.admit(0, PROMPT, 30)
    for _ in range(5):
        engine.step()
    engine.admit(1, PROMPT[:2] + [50] * 20, 16)
    while engine.active:
        engine.step()
    # against AR decoding alone: batch-independent and lossless at once
    assert engine.result(1).tokens == run_alone(models, PROMPT[:2] + [50] * 20, 16, max_len=96, mode="ar")
    assert engine.result(0).tokens == run_alone(models, PROMPT, 30, max_len=96, mode="ar")
    assert max(engine.result(0).accept_lengths) >= 2


def test_stops_at_eos(models):
    tokens = run_alone(models, PROMPT, 20)
    eos = tokens[6]
    engine = make(models)
    engine.admit("e", PROMPT, 20, eos_id=eos)
    while engine.active:
        engine.step()
    got = engine.result("e").tokens
    assert got == tokens[:tokens.index(eos) + 1]


def test_max_new_tokens_one_finishes_at_prefill(models):
    engine = make(models)
    engine.admit("x", PROMPT, 1)
    assert engine.active == 0 and engine.finished() == ["x"] and engine.result("x").target_forwards == 1
