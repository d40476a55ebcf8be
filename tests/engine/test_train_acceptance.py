"""The committed trained pairs: they load, they are what generate/serve use by default, they accept
what benchmarks/acceptance.py reported on its fixed check set, and DDTree stays exactly AR greedy."""

import json
from pathlib import Path

import pytest

from benchmarks.acceptance import CHECK, decode, run_check
from benchmarks.machine import describe
from engine import corpus
from engine.generate import load_models
from engine.scheduler import Request
from engine.tokenizer import load_tokenizer
from engine.trained import asset_dir, drafter_path, has_pair, load_pair, target_dir
from engine.workloads import generate as workload_requests

RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "acceptance.json"


@pytest.fixture(scope="module")
def tiny_pair():
    return load_pair("tiny")


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_committed_pairs_are_small_and_recorded(name):
    assert has_pair(name)
    size = (target_dir(name) / "model.safetensors").stat().st_size + drafter_path(name).stat().st_size
    assert size < 10_000_000  # a few MB: the weights are committed
    for run in ("train-target", "train-drafter"):
        record = json.loads((asset_dir(name) / f"{run}.json").read_text())
        assert record["command"].startswith(f"python -m engine {run} --model {name}")
        assert record["corpus"]["split"] == "train" and record["final_train_loss"] < record["first_train_loss"]


def test_generate_and_serve_load_the_trained_pair_by_default(tiny_pair):
    target, drafter = load_models("tiny", seed=0, device="cpu")
    trained_target, trained_drafter = tiny_pair
    assert target.lm_head.weight.equal(trained_target.lm_head.weight)
    assert drafter.fc.weight.equal(trained_drafter.fc.weight)
    random_target, _ = load_models("tiny", seed=0, device="cpu", random_weights=True)
    assert not random_target.lm_head.weight.equal(trained_target.lm_head.weight)


def test_committed_weights_reproduce_the_reported_acceptance(tiny_pair):
    result = json.loads(RESULT.read_text())
    reported, recorded = result["check"], result["machine"]
    assert {k: reported[k] for k in CHECK} == CHECK
    measured = run_check(*tiny_pair)
    # A near-tie argmax may flip where float32 sums run in another order, and one flip changes the rest
    # of that answer: the H200 host (torch 2.11) measured 2.43 tokens per step against 2.10. So the
    # reported number is held only where the CPU model and torch are the recording machine's (a VM's
    # CPU name may hide its generation, hence a little tolerance there too).
    if {k: recorded[k] for k in ("cpu", "torch")} == {k: describe()[k] for k in ("cpu", "torch")}:
        assert measured["tokens_per_step"] == pytest.approx(reported["tokens_per_step"], rel=0.1)
    assert measured["tokens_per_step"] > 2.0  # far above the ~1 token per step of untrained weights


def test_trained_ddtree_is_exactly_ar_greedy(tiny_pair):
    """With trained weights most steps accept several drafted tokens, so accept and KV compaction
    really move rows; the output must still be AR's, token for token."""
    target, drafter = tiny_pair
    requests = workload_requests("chat", 3, 5, load_tokenizer(), files=corpus.files("held-out"))
    requests = [Request(r.request_id, r.prompt_tokens[:48], 40) for r in requests]
    ar = decode(target, drafter, requests, "ar")
    for budget in (4, 16):
        dd = decode(target, drafter, requests, "ddtree", budget)
        assert [r.tokens for r in dd] == [r.tokens for r in ar]
        assert sum(sum(r.accept_lengths) for r in dd) > len(requests) * 10
