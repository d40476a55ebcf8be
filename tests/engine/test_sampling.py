"""Sampling at temperature > 0 stays lossless: DDTree emits exactly the seeded AR sample.

The trained tiny pair is used where acceptance matters (its drafts are often right, so the
accept walk really follows sampled choices down the tree); everything is deterministic.
"""

import json
import os
import random
import subprocess
import sys

import pytest
import torch

import engine.ddtree
from engine.engine import Engine
from engine.errors import EngineError
from engine.generate import generate
from engine.sampling import choose_tokens
from engine.tokenizer import load_tokenizer
from tests.engine.gpu_builder import models_for_gpu_builder
from tests.engine.test_lossless import oracle_propose

TOK = load_tokenizer()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Different lengths, so one batch mixes prefix lengths (and so positions).
PROMPTS = [[TOK.bos_id] + TOK.encode(text) for text in
           ("def f(x):\n    return x * 2\n", "import os", "a", "class Tree:\n    def __init__(self, nodes):\n")]
MAX_NEW = 20


def decode(models, prompts, *, mode="ddtree", budget=4, temperature=0.7, seeds=None, builder="cpu"):
    target, drafter = models
    engine = Engine(target, drafter, budget=budget, builder=builder, mode=mode, n_slots=len(prompts), max_len=160,
                    nvtx=False, temperature=temperature)
    for i, prompt in enumerate(prompts):
        engine.admit(i, prompt, MAX_NEW, seed=None if seeds is None else seeds[i])
    while engine.active:
        engine.step()
    return [engine.result(i) for i in range(len(prompts))]


@pytest.fixture(scope="module")
def ar_samples(trained):
    return {t: decode(trained, PROMPTS, mode="ar", temperature=t) for t in (0.7, 1.3)}


@pytest.mark.parametrize("temperature", [0.7, 1.3])
@pytest.mark.parametrize("budget", [1, 4, 16])
def test_ddtree_sample_equals_ar_sample(trained, ar_samples, temperature, budget):
    results = decode(trained, PROMPTS, budget=budget, temperature=temperature)
    for got, want in zip(results, ar_samples[temperature]):
        assert got.tokens == want.tokens and len(got.tokens) == MAX_NEW
    assert sum(n for r in results for n in r.accept_lengths) > 0  # the walk followed sampled tokens into the tree


def test_deep_sampled_paths_are_lossless(tiny, monkeypatch):
    """Drafts that contain the sampled continuation drive full-depth accepted paths."""
    ar = decode(tiny, PROMPTS, mode="ar", temperature=1.1)
    sequences = {i: PROMPTS[i] + ar[i].tokens for i in range(len(PROMPTS))}
    monkeypatch.setattr(engine.ddtree, "propose", oracle_propose(sequences, random.Random(0)))
    results = decode(tiny, PROMPTS, budget=12, temperature=1.1)
    assert [r.tokens for r in results] == [r.tokens for r in ar]
    assert max(n for r in results for n in r.accept_lengths) == tiny[1].config.depth


def test_request_alone_equals_request_in_a_batch(trained):
    seeds = [11, 12, 13, 14]
    batch = decode(trained, PROMPTS, budget=6, seeds=seeds)
    for i in (0, 2, 3):
        assert decode(trained, [PROMPTS[i]], budget=6, seeds=[seeds[i]])[0].tokens == batch[i].tokens
    # The default seed comes from the request id, not from the slot or the batch.
    assert decode(trained, PROMPTS[:2], budget=6)[1].tokens == decode(trained, PROMPTS, budget=6)[1].tokens


def test_seeds_and_temperature_change_the_sample(trained, ar_samples):
    prompt = [PROMPTS[0]]
    samples = {tuple(decode(trained, prompt, seeds=[s])[0].tokens) for s in range(4)}
    assert len(samples) == 4
    greedy = decode(trained, prompt, mode="ar", temperature=0.0)[0].tokens
    assert ar_samples[1.3][0].tokens != greedy


def test_temperature_zero_is_the_greedy_path(trained):
    target, _ = trained
    logits = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(0))
    positions, seeds = torch.arange(15).view(3, 5), torch.tensor([[1], [2], [3]])
    assert torch.equal(choose_tokens(logits, positions, seeds, 0.0), logits.argmax(-1))
    # Greedy ignores the seed; a vanishing temperature gives the greedy tokens too.
    greedy = decode(trained, PROMPTS[:2], mode="ar", temperature=0.0, seeds=[1, 2])
    assert [r.tokens for r in decode(trained, PROMPTS[:2], temperature=0.0, seeds=[7, 8])] == [r.tokens for r in greedy]
    assert [r.tokens for r in decode(trained, PROMPTS[:2], mode="ar", temperature=1e-6)] == [r.tokens for r in greedy]


def chi_square(choices: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(choices, minlength=probs.numel()).double()
    expected = probs.double() * choices.numel()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sample_distribution_is_softmax(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
    probs = torch.softmax(logits.double() / temperature, -1)
    n = 40_000
    over_seeds = choose_tokens(logits.expand(n, -1), torch.full((n,), 17), torch.arange(n), temperature)
    over_positions = choose_tokens(logits.expand(n, -1), torch.arange(n), torch.full((n,), 5), temperature)
    # 7 degrees of freedom: 24.3 is the 0.1% tail. Seeds are fixed, so this cannot flake.
    assert chi_square(over_seeds, probs) < 24.3
    assert chi_square(over_positions, probs) < 24.3


def test_gpu_builder_is_lossless_when_sampling(trained):
    target, drafter = models_for_gpu_builder(trained)
    prompts = [PROMPTS[1], PROMPTS[2]]
    ar = generate(target, drafter, prompts, mode="ar", max_new_tokens=8, nvtx=False, temperature=0.9, sample_seed=3)
    gpu, cpu = (generate(target, drafter, prompts, mode="ddtree", builder=builder, budget=5, max_new_tokens=8,
                         nvtx=False, temperature=0.9, sample_seed=3) for builder in ("gpu", "cpu"))
    assert [r.tokens for r in gpu] == [r.tokens for r in ar]
    assert [r.accept_lengths for r in gpu] == [r.accept_lengths for r in cpu]  # the same trees, step for step
    assert sum(sum(r.accept_lengths) for r in gpu) > 0  # and drafts were accepted: the trees mattered


def test_bad_temperature_and_seed_are_errors(trained):
    target, drafter = trained
    for temperature in (-0.5, 1e-310, float("nan"), float("inf")):  # 1e-310: logits / T overflow to inf
        with pytest.raises(EngineError, match="temperature"):
            Engine(target, drafter, budget=2, n_slots=1, max_len=64, temperature=temperature)
    engine = Engine(target, drafter, budget=2, n_slots=1, max_len=64, temperature=1.0, nvtx=False)
    with pytest.raises(EngineError, match="seed must be in"):
        engine.admit("r", PROMPTS[2], 4, seed=2**32)


def test_cli_sampled_ddtree_prints_the_ar_tokens():
    def run(mode, *tree):
        done = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", "tiny", "--mode", mode, *tree,
                               "--temperature", "0.8", "--sample-seed", "5", "--max-new-tokens", "16",
                               "--prompt", "import os", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    ar, ddtree = run("ar"), run("ddtree", "--budget", "8")
    assert ddtree["tokens"] == ar["tokens"] and ddtree["target_forwards"] < ar["target_forwards"]
