"""The static-shape step (engine/static_step.py) and its CUDA graphs (engine/cuda_graphs.py).

On the CPU the static step runs eagerly, the same code the graphs record: padded to buckets it
must emit AR's tokens exactly (greedy and sampled, both builders, requests finishing at different
steps, admissions mid-flight), equal the unpadded step, and never write a row outside its requests'
slots and the scratch slot. The `gpu` tests run the same cases on CUDA with graphs on and off,
and a whole step under `torch.cuda.set_sync_debug_mode("error")` except its commit.
"""

import json
import random

import pytest
import torch

import engine.ddtree
from engine.__main__ import main
from engine.engine import Engine
from engine.errors import EngineError
from engine.scheduler import Request, serve
from engine.static_step import batch_buckets, bucket_for
from tests.engine.gpu_builder import models_for_gpu_builder
from tests.engine.test_cli_errors import GENERATE, SERVE, assert_one_line
from tests.engine.test_cli_errors import engine as run_engine
from tests.engine.test_lossless import PROMPTS, encode, oracle_propose

# Answer lengths that differ, so requests finish at different steps and the batch shrinks through buckets.
MAX_NEW = (24, 9, 17, 3, 12)
ALL_PROMPTS = PROMPTS + ["x" * 40]
# Not the ids "cpu" and "gpu": a test id "gpu" is a keyword that tests/conftest.py skips without CUDA.
BUILDERS = [pytest.param("cpu", id="heapq"), pytest.param("gpu", id="triton")]


def requests():
    return [Request(i, encode(p), n) for i, (p, n) in enumerate(zip(ALL_PROMPTS, MAX_NEW))]


def decode(models, *, mode="ddtree", builder="cpu", budget=6, n_slots=5, concurrency=5, temperature=0.0,
           prefill_tokens=0, **engine_options):
    """Serve `requests()` through the scheduler: `concurrency` < 5 admits requests mid-flight;
    `prefill_tokens` > 0 prefills them in batches."""
    target, drafter = models
    eng = Engine(target, drafter, budget=budget, builder=builder, mode=mode, n_slots=n_slots, max_len=160,
                 nvtx=False, temperature=temperature, **engine_options)
    result = serve(eng, requests(), concurrency, prefill_tokens=prefill_tokens)
    return result.tokens, eng


def test_buckets_grow_to_the_slot_count():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(5) == (1, 2, 4, 5)
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 48, 64)
    assert batch_buckets(130) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 130)
    assert [bucket_for(batch_buckets(40), n) for n in (1, 3, 17, 33, 40)] == [1, 4, 24, 40, 40]


@pytest.fixture(scope="module")
def ar_tokens(trained):
    return decode(trained, mode="ar")[0]


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("n_slots,concurrency", [(5, 5), (8, 3)])  # padding rows; mid-flight admissions
def test_static_step_is_lossless(trained, ar_tokens, builder, n_slots, concurrency):
    models = trained if builder == "cpu" else models_for_gpu_builder(trained)
    static, eng = decode(models, builder=builder, n_slots=n_slots, concurrency=concurrency, static_shapes=True)
    eager, _ = decode(models, builder=builder, n_slots=n_slots, concurrency=concurrency)
    assert static == eager == ar_tokens
    assert [len(static[i]) for i in range(5)] == list(MAX_NEW)
    assert eng.static_step is not None and eng.cache.kv.shape[1] == n_slots + 1  # one scratch slot


@pytest.mark.parametrize("builder", BUILDERS)
def test_static_step_samples_losslessly(trained, builder):
    models = trained if builder == "cpu" else models_for_gpu_builder(trained)
    want, _ = decode(models, mode="ar", temperature=0.8)
    static, _ = decode(models, builder=builder, n_slots=6, concurrency=4, temperature=0.8, static_shapes=True)
    assert static == want


def test_static_step_compacts_long_accepted_paths(tiny, monkeypatch):
    """Drafts that are often right (the oracle) make deep paths, so compaction moves many rows."""
    reference, _ = decode(tiny, mode="ar")
    sequences = {r.request_id: r.prompt_tokens + reference[r.request_id] for r in requests()}
    monkeypatch.setattr(engine.ddtree, "propose", oracle_propose(sequences, random.Random(3)))
    tokens, eng = decode(tiny, budget=12, n_slots=5, concurrency=5, static_shapes=True)
    assert tokens == reference


def test_padding_rows_touch_only_the_scratch_slot(trained):
    """Three requests in a 4-row bucket of a 6-slot engine: slots 3..5 (free) keep their sentinel rows in
    the target's cache, the drafter's cache and the pending features; the scratch slot 6 is written."""
    target, drafter = trained
    eng = Engine(target, drafter, budget=6, n_slots=6, max_len=160, nvtx=False, static_shapes=True)
    eng.admit("a", encode(PROMPTS[1]), 8)
    eng.admit("b", encode(PROMPTS[3]), 8)
    eng.admit("c", encode(PROMPTS[2]), 8)
    decoder = eng.decoder
    free = slice(3, 6)
    # Each state tensor, and a view of its free slots' rows (the slot axis is 1 in the caches, 0 in pending).
    views = [lambda: eng.cache.kv[:, free], lambda: decoder.drafter_cache.kv[:, free], lambda: decoder.pending[free]]
    for view in views:
        view().fill_(7.0)
    before = eng.cache.kv[:, 6].clone()
    while eng.active:
        eng.step()
    for view in views:
        assert bool((view() == 7.0).all())
    assert not torch.equal(before, eng.cache.kv[:, 6])  # the padding rows wrote the scratch slot


def test_cuda_graphs_refused_on_a_cpu_engine(trained):
    target, drafter = trained
    with pytest.raises(EngineError, match="needs a CUDA device"):
        Engine(target, drafter, budget=4, n_slots=2, max_len=64, cuda_graphs=True)
    with pytest.raises(EngineError, match="only for ddtree"):
        Engine(target, drafter, budget=4, mode="ar", n_slots=2, max_len=64, static_shapes=True)


@pytest.mark.parametrize("command", [GENERATE, SERVE + ["--check"]])
def test_cuda_graphs_flag_refused_in_one_line_on_the_cpu(command):
    assert_one_line(run_engine(*command, "--device", "cpu", "--cuda-graphs"), "--cuda-graphs", "CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is a CPU engine's")
def test_ddprof_capture_refuses_cuda_graphs_on_the_cpu_before_nsys(tmp_path):
    from tests.ddprof.test_capture_cli import ddprof

    done = ddprof("capture", "--workload", "chat", "--model", "tiny", "--cuda-graphs", "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("ddprof: error: --cuda-graphs: needs a CUDA device")
    assert list(tmp_path.iterdir()) == []


def test_cuda_graphs_with_ar_refused_in_one_line():
    assert_one_line(run_engine(*GENERATE, "--mode", "ar", "--cuda-graphs"), "--cuda-graphs")


def test_serve_summary_records_no_graphs_when_off(tmp_path):
    summary = tmp_path / "summary.json"
    assert main([*SERVE, "--device", "cpu", "--no-cuda-graphs", "--summary", str(summary)]) == 0
    result = json.loads(summary.read_text())
    assert result["cuda_graphs"] is False and result["graph_buckets"] is None and result["graph_record_s"] is None


def test_sweep_passes_cuda_graphs_to_every_capture():
    """(ddprof capture's command line: tests/ddprof/test_capture_cli.py.)"""
    from ddprof.sweep import Grid

    grid = Grid(concurrency=(1, 2), builders=("cpu",), budgets=(4,), model="tiny", requests=2, max_new_tokens=4,
                cuda_graphs=True)
    assert all(point.cuda_graphs for point in grid.points())


def test_help_says_graphs_are_on_by_default_on_cuda():
    for command in (["serve", "--help"], ["generate", "--help"]):
        done = run_engine(*command)
        assert "--cuda-graphs" in done.stdout and "default: on for DDTree on CUDA" in " ".join(done.stdout.split())


def test_graphs_by_default_only_where_they_run():
    from engine.arguments import cuda_graphs

    assert cuda_graphs(None, "cuda") and cuda_graphs(None, "cuda", "ddtree", ranks=1)
    assert not cuda_graphs(None, "cpu") and not cuda_graphs(None, "cuda", "ar") and not cuda_graphs(None, "cuda", ranks=2)
    assert not cuda_graphs(False, "cuda")
    with pytest.raises(EngineError, match="one rank only"):
        cuda_graphs(True, "cuda", ranks=2)


# --- CUDA: graphs on vs off, and no host wait inside a step -------------------------------------------


def cuda_models(trained):
    return models_for_gpu_builder(trained)


@pytest.mark.gpu
@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("n_slots,concurrency", [(5, 5), (8, 3)])
def test_graphs_on_equal_graphs_off_and_ar(trained, builder, temperature, n_slots, concurrency):
    models = cuda_models(trained)
    want, _ = decode(models, mode="ar", temperature=temperature)
    options = dict(builder=builder, n_slots=n_slots, concurrency=concurrency, temperature=temperature)
    graphed, eng = decode(models, cuda_graphs=True, **options)
    static, _ = decode(models, static_shapes=True, **options)
    eager, _ = decode(models, **options)
    assert graphed == static == eager == want
    assert eng.graphs.buckets == batch_buckets(n_slots) and eng.graphs.record_s > 0


@pytest.mark.gpu
def test_graphed_request_alone_equals_in_a_batch(trained):
    models = cuda_models(trained)
    batch, _ = decode(models, builder="gpu", cuda_graphs=True)
    target, drafter = models
    for request in requests():
        alone = Engine(target, drafter, budget=6, builder="gpu", n_slots=1, max_len=160, nvtx=False, cuda_graphs=True)
        assert serve(alone, [request], 1).tokens[request.request_id] == batch[request.request_id]


@pytest.mark.gpu
def test_a_static_step_never_waits_for_the_gpu_before_its_commit(trained):
    target, drafter = cuda_models(trained)
    eng = Engine(target, drafter, budget=6, builder="gpu", n_slots=4, max_len=160, nvtx=False, static_shapes=True)
    for i in range(3):
        eng.admit(i, encode(PROMPTS[i]), 12)
    eng.step()  # the first step compiles the kernels
    static = eng.static_step
    rows = [[eng.requests[i].slot for i in range(3)], [eng.requests[i].seed for i in range(3)]]  # HOST_INPUTS
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step = static.fill(rows)
        static.run_stages(step, 3)
        committed = step.committed_rows()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert committed.shape == (4, drafter.config.depth + 2)


@pytest.mark.gpu
def test_a_bucket_too_big_for_the_gpu_is_refused_before_serving(trained, monkeypatch):
    target, drafter = cuda_models(trained)
    total = torch.cuda.mem_get_info()[1]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1024, total))
    with pytest.raises(EngineError, match=r"batch bucket 8 needs [0-9.]+ GiB for its graphs"):
        Engine(target, drafter, budget=6, builder="gpu", n_slots=8, max_len=160, nvtx=False, cuda_graphs=True)


@pytest.mark.gpu
def test_serve_summary_records_the_graphs(tmp_path):
    summary = tmp_path / "summary.json"
    assert main([*SERVE, "--device", "cuda", "--builder", "gpu", "--cuda-graphs", "--summary", str(summary)]) == 0
    result = json.loads(summary.read_text())
    assert result["cuda_graphs"] is True and result["graph_buckets"] == [1, 2] and result["graph_record_s"] > 0
