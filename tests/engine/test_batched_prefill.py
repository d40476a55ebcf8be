"""Batched prefill (`TargetModel.prefill_many`, `Engine.admit_many`, the scheduler's `prefill_tokens`).

Several prompts in one forward must compute every row exactly as the prompt's own prefill does
(batch-invariant `linear` and MoE; attention per prompt), so every request's tokens equal the
one-at-a-time run's and AR's: greedy and sampled, both builders, AR itself, admissions mid-flight,
eager, static-shape and overlapped steps. The `gpu` tests run the same on CUDA with graphs on.
"""

import json

import pytest
import torch

from engine.__main__ import main
from engine.config import preset
from engine.engine import Admission, Engine
from engine.errors import EngineError
from engine.model import build_target
from engine.scheduler import Request, serve
from engine.stages import PREFILL, STAGES
from tests.engine.gpu_builder import models_for_gpu_builder
from tests.engine.test_cli_errors import SERVE, assert_one_line
from tests.engine.test_cli_errors import engine as run_engine
from tests.engine.test_lossless import PROMPTS, encode
from tests.engine.test_overlap import ar_greedy, ar_sampled, models_for, recorded_nvtx  # noqa: F401 (fixtures)
from tests.engine.test_static_step import BUILDERS, decode, requests

# Prompt-token budgets: 48 splits requests() (prompts of 4, 41, 2, 12, 41 tokens) into batches of
# three, one and one, 10 000 takes every request that fits in flight.
BUDGETS = (48, 10_000)
STEPS = [pytest.param({}, id="eager"), pytest.param({"static_shapes": True}, id="static"),
         pytest.param({"overlap": True}, id="overlap")]
CASES = [(5, 5), (8, 3)]  # (slots, concurrency): all admitted at once; admissions mid-flight


def prefill_alone_and_together(target, feature_layers, prompts):
    """Each prompt's (logits, features, cache rows) prefilled alone, and all of them in one forward."""
    kv_alone, kv_together = (torch.zeros(target.config.num_hidden_layers, len(prompts), 64, target.config.latent_dim,
                                         dtype=target.dtype, device=target.device) for _ in range(2))
    alone = [target.prefill(p, kv_alone, slot, feature_layers) for slot, p in enumerate(prompts)]
    logits, features = target.prefill_many(prompts, kv_together, list(range(len(prompts))), feature_layers)
    return alone, (logits, features), kv_alone, kv_together


def prompt_tensors(device):
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, 200, (n,), generator=generator).to(device) for n in (1, 7, 30, 3, 16)]


def assert_rows_equal_alone(model_name, device):
    p = preset(model_name)
    target = build_target(p.model, seed=0, device=device)
    alone, (logits, features), kv_alone, kv_together = prefill_alone_and_together(
        target, p.drafter.target_layer_ids, prompt_tensors(device))
    assert logits.shape == (5, p.model.vocab_size) and len(features) == 5
    for i, (want_logits, want_features) in enumerate(alone):
        assert torch.equal(logits[i], want_logits) and torch.equal(features[i], want_features)
    assert torch.equal(kv_together, kv_alone)


@pytest.mark.parametrize("model_name", ["tiny", "small"])
def test_prefill_many_computes_every_row_as_its_prompt_alone(model_name):
    assert_rows_equal_alone(model_name, "cpu")


def test_prefill_many_without_feature_layers_returns_no_features(tiny):
    target, _ = tiny
    kv = torch.zeros(target.config.num_hidden_layers, 2, 64, target.config.latent_dim)
    logits, features = target.prefill_many([torch.tensor([3, 4]), torch.tensor([5])], kv, [0, 1])
    assert logits.shape[0] == 2 and features is None


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("n_slots,concurrency", CASES)
@pytest.mark.parametrize("prefill_tokens", BUDGETS)
def test_batched_prefill_is_lossless(trained, ar_greedy, builder, steps, n_slots, concurrency, prefill_tokens):
    options = dict(builder=builder, n_slots=n_slots, concurrency=concurrency, **steps)
    models = models_for(trained, builder)
    batched, eng = decode(models, prefill_tokens=prefill_tokens, **options)
    one_by_one, _ = decode(models, **options)
    assert batched == one_by_one == ar_greedy
    assert not eng.requests and eng.cache.n_free == n_slots


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("steps", STEPS)
def test_batched_prefill_samples_losslessly(trained, ar_sampled, builder, steps):
    models = models_for(trained, builder)
    batched, _ = decode(models, builder=builder, n_slots=6, concurrency=4, temperature=0.8, prefill_tokens=10_000,
                        **steps)
    assert batched == ar_sampled


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_prefill_for_ar_decoding(trained, temperature):
    batched, _ = decode(trained, mode="ar", n_slots=8, concurrency=3, temperature=temperature, prefill_tokens=10_000)
    assert batched == decode(trained, mode="ar", temperature=temperature)[0]


def recorded_batches(eng):
    """The request ids of every `admit_many` call (the calls still run)."""
    batches, admit_many = [], eng.admit_many

    def recording(admissions):
        batches.append([a.request_id for a in admissions])
        admit_many(admissions)

    eng.admit_many = recording
    return batches


@pytest.mark.parametrize("prefill_tokens,want", [
    (0, [[0], [1], [2], [3], [4]]),  # one at a time (the default)
    (48, [[0, 1, 2], [3], [4]]),  # 4 + 41 + 2; 12 + 41 is past the budget
    (20, [[0], [1], [2, 3], [4]]),  # 41 > 20: prefilled alone
    (10_000, [[0, 1, 2, 3, 4]]),
])
def test_the_scheduler_batches_what_the_token_budget_holds(trained, prefill_tokens, want):
    target, drafter = trained
    eng = Engine(target, drafter, budget=6, n_slots=5, max_len=160, nvtx=False)
    batches = recorded_batches(eng)
    result = serve(eng, requests(), 5, prefill_tokens=prefill_tokens)
    assert batches == want and result.prefills == len(want)


def test_batches_stop_at_the_concurrency_and_the_free_slots(trained):
    """Concurrency 3 over 4 slots: the first batch is three requests; later ones fill freed places only."""
    target, drafter = trained
    eng = Engine(target, drafter, budget=6, n_slots=4, max_len=160, nvtx=False)
    batches = recorded_batches(eng)
    serve(eng, requests(), 3, prefill_tokens=10_000)
    assert batches[0] == [0, 1, 2] and sorted(sum(batches, [])) == [0, 1, 2, 3, 4]
    assert all(len(batch) <= 3 for batch in batches)


def test_admit_many_checks_every_request_before_admitting_any(trained):
    target, drafter = trained
    eng = Engine(target, drafter, budget=4, n_slots=2, max_len=64, nvtx=False)
    prompt = encode(PROMPTS[0])
    refused = [
        ([Admission("a", prompt, 4), Admission("a", prompt, 4)], "appears twice"),
        ([Admission("a", prompt, 4), Admission("b", [], 4)], "non-empty prompt"),
        ([Admission(i, prompt, 4) for i in range(3)], "request 2: no free slot .* 0 slots free"),
        ([Admission("a", prompt, 4), Admission("b", prompt, 400)], "request 'b': no free slot"),
        ([Admission("a", prompt, 4, seed=2**32)], "seed must be"),
    ]
    for admissions, message in refused:
        with pytest.raises(EngineError, match=message):
            eng.admit_many(admissions)
        assert not eng.requests and eng.cache.n_free == 2
    eng.admit("a", prompt, 4)
    with pytest.raises(EngineError, match="already admitted"):
        eng.admit_many([Admission("b", prompt, 4), Admission("a", prompt, 4)])
    assert list(eng.requests) == ["a"] and eng.cache.n_free == 1


def test_requests_that_stop_at_their_batched_prefill(trained):
    """max_new_tokens 1 and an EOS first token end at the prefill, inside a batch with others."""
    reference = decode(trained, mode="ar")[0]
    eos = reference[1][0]
    batch = [Request(0, encode(PROMPTS[0]), 1), Request(1, encode(PROMPTS[1]), 9), Request(2, encode(PROMPTS[2]), 12)]
    target, drafter = trained

    def run(prefill_tokens, **options):
        eng = Engine(target, drafter, budget=6, n_slots=3, max_len=160, nvtx=False, **options)
        return serve(eng, batch, 3, eos_id=eos, prefill_tokens=prefill_tokens).tokens

    want = run(0, mode="ar")
    assert run(10_000) == run(10_000, overlap=True) == run(10_000, static_shapes=True) == want
    assert want[0] == reference[0][:1] and want[1] == [eos]


def test_one_prefill_range_per_batch_holding_no_stage(trained):
    target, drafter = trained
    eng = Engine(target, drafter, budget=6, n_slots=4, max_len=160, overlap=True)
    events = recorded_nvtx(eng)
    result = serve(eng, requests(), 4, prefill_tokens=10_000)
    prefills = [i for i, event in enumerate(events) if event == ("push", PREFILL)]
    assert len(prefills) == result.prefills < len(requests())
    for start in prefills:
        inside = events[start + 1:events.index(("pop", PREFILL), start)]
        assert not [name for _, name in inside if name in STAGES]


def test_a_negative_budget_is_refused(trained):
    target, drafter = trained
    eng = Engine(target, drafter, budget=4, n_slots=2, max_len=64, nvtx=False)
    with pytest.raises(EngineError, match="prefill tokens must be at least 0"):
        serve(eng, requests()[:1], 1, prefill_tokens=-1)
    assert_one_line(run_engine(*SERVE, "--device", "cpu", "--prefill-tokens", "-1", "--check"), "--prefill-tokens",
                    "at least 0")


def test_serve_summary_records_the_budget_and_the_prefills(tmp_path):
    def summary_of(*options):
        summary = tmp_path / "summary.json"
        assert main([*SERVE, "--device", "cpu", *options, "--summary", str(summary)]) == 0
        return json.loads(summary.read_text())

    one_by_one, batched = summary_of("--prefill-tokens", "0"), summary_of("--prefill-tokens", "1000")
    assert one_by_one["prefill_token_budget"] == 0 and one_by_one["prefills"] == one_by_one["requests"] == 2
    assert batched["prefill_token_budget"] == 1000 and batched["prefills"] == 1
    assert batched["tokens"] == one_by_one["tokens"] and batched["generated_tokens"] == one_by_one["generated_tokens"]


def test_batched_prefill_by_default():
    import inspect

    from engine.serve_defaults import DEFAULT_PREFILL_TOKENS

    assert DEFAULT_PREFILL_TOKENS > 0
    assert inspect.signature(serve).parameters["prefill_tokens"].default == DEFAULT_PREFILL_TOKENS
    done = run_engine("serve", "--help")
    assert f"0 prefills one request at a time (default {DEFAULT_PREFILL_TOKENS})" in " ".join(done.stdout.split())


def test_capture_and_sweep_pass_the_budget_on():
    from ddprof.capture import CaptureRequest, serve_command
    from ddprof.errors import DdprofError
    from ddprof.sweep import Grid

    command = serve_command(CaptureRequest(workload="chat", concurrency=2, out="run", prefill_tokens=512), "cpu",
                            "summary.json", "progress")
    assert command[command.index("--prefill-tokens") + 1] == "512"
    assert "--prefill-tokens" not in serve_command(CaptureRequest(workload="chat", concurrency=2, out="run"), "cpu",
                                                   "summary.json", "progress")
    grid = dict(concurrency=(1, 2), builders=("cpu",), budgets=(4,), model="tiny", requests=2, max_new_tokens=4)
    assert all(point.prefill_tokens == 256 for point in Grid(**grid, prefill_tokens=256).points())
    with pytest.raises(DdprofError, match="--prefill-tokens must be at least 0"):
        Grid(**grid, prefill_tokens=-1)


# --- CUDA, graphs on ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("model_name", ["tiny", "small"])
def test_prefill_many_on_cuda_computes_every_row_as_its_prompt_alone(model_name):
    assert_rows_equal_alone(model_name, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("n_slots,concurrency", CASES)
@pytest.mark.parametrize("overlap", [False, True])
def test_graphed_batched_prefill_equals_one_by_one_and_ar(trained, builder, temperature, n_slots, concurrency,
                                                          overlap):
    models = models_for_gpu_builder(trained)
    want, _ = decode(models, mode="ar", temperature=temperature)
    options = dict(builder=builder, n_slots=n_slots, concurrency=concurrency, temperature=temperature,
                   cuda_graphs=True, overlap=overlap)
    batched, eng = decode(models, prefill_tokens=10_000, **options)
    one_by_one, _ = decode(models, **options)
    assert batched == one_by_one == want
    assert eng.graphs is not None


@pytest.mark.gpu
def test_ar_batched_prefill_on_cuda(trained):
    models = models_for_gpu_builder(trained)
    assert decode(models, mode="ar", n_slots=8, concurrency=3, prefill_tokens=10_000)[0] == \
        decode(models, mode="ar")[0]


def test_warm_up_compiles_for_the_largest_forward_a_serve_can_run(trained):
    """serve.max_rows: a batched prefill's prompt tokens, the longest prompt alone, or a step's
    rows in every slot, the larger of verify's 1 + budget and the drafter's 1 + depth."""
    from engine.serve import max_rows
    target, drafter = trained
    reqs = requests()  # prompts of 4, 41, 2, 12, 41 tokens
    eng = Engine(target, drafter, budget=2, n_slots=5, max_len=160, nvtx=False)
    step = 5 * max(3, 1 + drafter.config.depth)
    assert max_rows(eng, reqs, 0) == max(41, step) and max_rows(eng, reqs, 10_000) == 10_000
    ar = Engine(target, None, mode="ar", budget=2, n_slots=50, max_len=160, nvtx=False)
    assert max_rows(ar, reqs, 0) == 50  # one row per slot
