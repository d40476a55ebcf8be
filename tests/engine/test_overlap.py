"""Overlap scheduling (`Engine(overlap=True)`, engine/engine.py): step N+1 is launched before step
N's tokens reach the host, its inputs taken from what step N left on the device.

On the CPU the overlapped order runs the same work reordered, so every request's tokens must equal
the non-overlapped run's and AR's exactly: greedy and sampled, both builders, requests finishing at
different steps (their next step's rows discarded), admissions mid-flight into slots freed while a
step was in flight, and requests that stop at their prefill. The `gpu` tests run the same cases on
CUDA with graphs on, where the host really runs ahead.
"""

import json
from contextlib import contextmanager

import pytest
import torch

from engine.__main__ import main
from engine.engine import Engine
from engine.errors import EngineError
from engine.scheduler import Request, serve
from engine.stages import STAGES, STEP, TOKENS_MARK
from tests.engine.gpu_builder import models_for_gpu_builder
from tests.engine.test_cli_errors import SERVE, assert_one_line
from tests.engine.test_cli_errors import engine as run_engine
from tests.engine.test_lossless import PROMPTS, encode
from tests.engine.test_static_step import BUILDERS, MAX_NEW, decode, requests

CASES = [(5, 5), (8, 3), (2, 2)]  # (slots, concurrency): padding rows; mid-flight admissions; slots reused often


@pytest.fixture(scope="module")
def ar_greedy(trained):
    return decode(trained, mode="ar")[0]


@pytest.fixture(scope="module")
def ar_sampled(trained):
    return decode(trained, mode="ar", temperature=0.8)[0]


def models_for(trained, builder):
    return trained if builder == "cpu" else models_for_gpu_builder(trained)


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("n_slots,concurrency", CASES)
def test_overlap_is_lossless(trained, ar_greedy, builder, n_slots, concurrency):
    models = models_for(trained, builder)
    options = dict(builder=builder, n_slots=n_slots, concurrency=concurrency)
    overlapped, eng = decode(models, overlap=True, **options)
    in_order, _ = decode(models, static_shapes=True, **options)
    assert overlapped == in_order == ar_greedy
    assert [len(overlapped[i]) for i in range(5)] == list(MAX_NEW)
    assert eng.in_flight is None and not eng.requests  # the last step in flight was dropped, every slot freed


@pytest.mark.parametrize("builder", BUILDERS)
def test_overlap_samples_losslessly(trained, ar_sampled, builder):
    models = models_for(trained, builder)
    overlapped, _ = decode(models, builder=builder, n_slots=6, concurrency=4, temperature=0.8, overlap=True)
    assert overlapped == ar_sampled


def test_overlap_counts_only_the_steps_a_request_took_part_in(trained):
    """A request's discarded rows (the step after it stopped) are no target forward of its own, and
    each step's committed tokens come back from the call after it."""
    target, drafter = trained

    def run(overlap):
        eng = Engine(target, drafter, budget=6, n_slots=3, max_len=160, nvtx=False, overlap=overlap,
                     static_shapes=True)
        for i in range(3):
            eng.admit(i, encode(PROMPTS[i]), MAX_NEW[i])
        per_call = []
        while eng.active:
            per_call.append(eng.step())
        return [eng.result(i) for i in range(3)], per_call

    (overlapped, late), (in_order, prompt) = run(True), run(False)
    assert overlapped == in_order
    assert late[0] == {} and late[1:] == prompt  # one call behind
    assert len(late) == len(prompt) + 1


def test_overlap_with_requests_that_stop_at_their_prefill(trained):
    """max_new_tokens 1 (and an EOS first token) stop at prefill: their first token reaches the host
    only at their first commit, so they ride one step whose rows are all discarded."""
    target, drafter = trained
    reference = decode(trained, mode="ar")[0]
    eos = reference[1][0]  # request 1's first token, as the EOS: it stops at its prefill
    batch = [Request(0, encode(PROMPTS[0]), 1), Request(1, encode(PROMPTS[1]), 9), Request(2, encode(PROMPTS[2]), 12)]

    def run(**options):
        eng = Engine(target, drafter, budget=6, n_slots=2, max_len=160, nvtx=False, **options)
        return serve(eng, batch, 2, eos_id=eos).tokens

    want = run(mode="ar")
    assert run(overlap=True) == run(static_shapes=True) == want
    assert want[0] == reference[0][:1] and want[1] == [eos]


def recorded_nvtx(eng):
    """The engine's NVTX ranges (("push" | "pop", name)) and marks ((name, payload)) as it emits them."""
    events = []

    @contextmanager
    def recorded(name):
        events.append(("push", name))
        yield
        events.append(("pop", name))

    eng.nvtx.range = recorded
    eng.nvtx.mark = lambda name, payload: events.append((name, payload))
    return events


def test_overlapped_steps_keep_the_nvtx_contract(trained):
    """Each step is one `step` range holding the six stage ranges on the calling thread, then one
    `tokens` mark: what that step's `sampling` committed (the step before's tokens)."""
    target, drafter = trained
    eng = Engine(target, drafter, budget=6, n_slots=3, max_len=160, overlap=True)
    events = recorded_nvtx(eng)
    result = serve(eng, requests()[:4], 3)
    steps = [i for i, event in enumerate(events) if event == ("push", STEP)]
    assert len(steps) == result.steps
    stage_pushes = [name for kind, name in events if kind == "push" and name in STAGES]
    assert stage_pushes == list(STAGES) * result.steps
    for start in steps:  # each step closes before its mark, and the mark comes before the next step
        close = events.index(("pop", STEP), start)
        assert events[close + 1][0] == TOKENS_MARK
    assert sum(payload for name, payload in events if name == TOKENS_MARK) == result.step_tokens
    assert result.step_tokens == sum(len(tokens) - 1 for tokens in result.tokens.values())  # all but prefill's


def test_overlap_refused_for_ar_in_one_line(trained):
    target, drafter = trained
    with pytest.raises(EngineError, match="--overlap: only for --mode ddtree"):
        Engine(target, drafter, budget=4, mode="ar", n_slots=2, max_len=64, overlap=True)


def summary_of(tmp_path, *options):
    summary = tmp_path / "summary.json"
    assert main([*SERVE, "--device", "cpu", *options, "--summary", str(summary)]) == 0
    return json.loads(summary.read_text())


def test_serve_summary_says_what_the_overlap_hides(tmp_path):
    """On the CPU overlap is off by default (no static step); --overlap runs it, and with the CPU
    builder the summary says it stops at draft."""
    default = summary_of(tmp_path)
    assert default["overlap"] is False and default["overlap_scope"] is None
    on = summary_of(tmp_path, "--overlap")
    assert on["overlap"] is True and on["overlap_scope"].startswith("draft only")
    assert on["tokens"] == default["tokens"] and on["steps"] == default["steps"] + 1  # the one step dropped at the end


def test_overlap_on_by_default_where_the_graphed_step_runs():
    from engine.arguments import overlap, overlap_scope

    assert overlap(None, static_step=True) and not overlap(None, static_step=False)
    assert not overlap(None, static_step=True, ranks=2) and not overlap(False, static_step=True)
    assert overlap(True, static_step=False)  # the static step then runs eagerly
    assert overlap_scope(True, "gpu") == "whole step" and overlap_scope(False, "gpu") is None


def test_overlap_with_ranks_refused_in_one_line():
    assert_one_line(run_engine(*SERVE, "--device", "cpu", "--overlap", "--ranks", "2", "--check"), "--overlap",
                    "one rank")


def test_help_says_the_cpu_builder_overlaps_only_draft():
    done = run_engine("serve", "--help")
    assert "With --builder cpu the overlap stops at draft" in " ".join(done.stdout.split())


def test_sweep_passes_overlap_to_every_capture():
    from ddprof.sweep import Grid

    grid = Grid(concurrency=(1, 2), builders=("cpu", "gpu"), budgets=(4,), model="tiny", requests=2, max_new_tokens=4,
                overlap=False)
    assert all(point.overlap is False for point in grid.points())


# --- CUDA, graphs on: the host really runs ahead ---------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("n_slots,concurrency", CASES)
def test_graphed_overlap_equals_in_order_and_ar(trained, builder, temperature, n_slots, concurrency):
    models = models_for_gpu_builder(trained)
    want, _ = decode(models, mode="ar", temperature=temperature)
    options = dict(builder=builder, n_slots=n_slots, concurrency=concurrency, temperature=temperature,
                   cuda_graphs=True)
    overlapped, eng = decode(models, overlap=True, **options)
    in_order, _ = decode(models, **options)
    assert overlapped == in_order == want
    assert eng.graphs is not None and eng.in_flight is None


@pytest.mark.gpu
def test_graphed_overlap_launches_the_next_step_before_the_last_one_lands(trained):
    """With the GPU builder, launching step N+1 never waits for the GPU: under sync debug mode
    "error" the launch (draft .. kv_compact) and the send of its tokens run without a host wait."""
    target, drafter = models_for_gpu_builder(trained)
    eng = Engine(target, drafter, budget=6, builder="gpu", n_slots=4, max_len=160, nvtx=False, cuda_graphs=True,
                 overlap=True)
    for i in range(3):
        eng.admit(i, encode(PROMPTS[i]), 40)
    eng.step()
    static = eng.static_step
    torch.cuda.set_sync_debug_mode("error")
    try:
        launched = static.launch([0, 1, 2], [eng.requests[i].slot for i in range(3)],
                                 [eng.requests[i].seed for i in range(3)])
        static.send(launched)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(static.land(launched)) == 3
