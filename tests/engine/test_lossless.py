"""Greedy DDTree decoding emits exactly the autoregressive tokens, whatever the budget or batch."""

import dataclasses
import random

import pytest
import torch

import engine.ddtree
from engine.config import preset
from engine.drafter import build_drafter
from engine.model import build_target
from engine.engine import Engine
from engine.tokenizer import load_tokenizer

TOK = load_tokenizer()
PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog, again and again and again.", "a",
           "def f(x):\n    return x * 2\n"]


def encode(text):
    return [TOK.bos_id] + TOK.encode(text)


def decode_all(models, mode, prompts, *, budget=4, max_new=24, max_len=160):
    target, drafter = models
    engine = Engine(target, drafter, budget=budget, mode=mode, n_slots=len(prompts), max_len=max_len, nvtx=False)
    for i, prompt in enumerate(prompts):
        engine.admit(i, prompt, max_new)
    while engine.active:
        engine.step()
    return [engine.result(i) for i in range(len(prompts))]


@pytest.fixture(scope="module")
def reference(trained):
    return decode_all(trained, "ar", [encode(p) for p in PROMPTS])


# The trained pair's drafts are often right (the random pair's almost never are), so accepted
# paths of several tokens make the accept walk and the cache compaction move real rows.
@pytest.mark.parametrize("budget", [1, 3, 8, 24])
def test_ddtree_batch_equals_ar(trained, reference, budget):
    results = decode_all(trained, "ddtree", [encode(p) for p in PROMPTS], budget=budget)
    for got, want in zip(results, reference):
        assert got.tokens == want.tokens and len(got.tokens) == 24
        assert got.target_forwards == 1 + len(got.accept_lengths)
    accepted = [n for r in results for n in r.accept_lengths]
    assert max(accepted) >= min(budget, 2) and sum(accepted) >= len(PROMPTS) * 4


@pytest.mark.parametrize("prompt,budget", [(PROMPTS[0], 2), (PROMPTS[1], 16), (PROMPTS[3], 5)])
def test_ddtree_single_request_equals_ar(trained, reference, prompt, budget):
    got = decode_all(trained, "ddtree", [encode(prompt)], budget=budget)[0]
    assert got.tokens == reference[PROMPTS.index(prompt)].tokens and max(got.accept_lengths) >= 1


def test_request_alone_equals_request_in_a_batch(trained):
    prompts = [encode(p) for p in PROMPTS] + [encode("x" * n) for n in (3, 40, 90)]
    batch = decode_all(trained, "ddtree", prompts, budget=6)
    assert max(n for r in batch for n in r.accept_lengths) >= 2
    for i, prompt in enumerate(prompts):
        assert decode_all(trained, "ddtree", [prompt], budget=6)[0].tokens == batch[i].tokens


def oracle_propose(sequences, generator):
    """A stand-in for the drafter's proposals that is often right: the random-weight drafter is
    almost never right, so this is how the test drives long accepted paths (deep compaction).

    At every depth the true continuation (from the AR run) sits at rank 0, 1 or 2, or is missing.
    """

    def propose(drafter, target, cache, slots, context_lens, bonus, top_k, context_rows=None):
        depth, vocab = drafter.config.depth, target.config.vocab_size
        # Rank 0 far likelier than the rest: the tree grows a deep chain first, then siblings.
        ranks = torch.arange(top_k, dtype=torch.float32)
        log_probs = torch.where(ranks == 0, -0.05, -3.0 - ranks).expand(len(slots), depth, top_k).clone()
        ids = torch.zeros(len(slots), depth, top_k, dtype=torch.int64)
        for b, (slot, start) in enumerate(zip(slots.tolist(), context_lens.tolist())):
            if slot not in sequences:  # a static step's padding row: any proposal will do
                continue
            sequence = sequences[slot]
            assert sequence[start] == bonus[b].item()  # the bonus is the token at position prefix_len
            for d in range(depth):
                true = sequence[start + 1 + d] if start + 1 + d < len(sequence) else 0
                others = [t for t in generator.sample(range(vocab), top_k + 1) if t != true][:top_k]
                rank = generator.choice([0, 0, 0, 0, 0, 1, 2, top_k])
                if rank < top_k:
                    others[rank] = true
                ids[b, d] = torch.tensor(others)
                log_probs[b, d] -= 0.01 * d
        return log_probs, ids

    return propose


@pytest.fixture(scope="module")
def variant():
    """tiny as checkpoints without DeepSeek-V3's own choices come: rotate-half RoPE (rope_interleave
    false), no query compression (q_lora_rank null), the head tied to the embedding."""
    p = preset("tiny")
    config = dataclasses.replace(p.model, rope_interleave=False, q_lora_rank=None, tie_word_embeddings=True)
    return build_target(config, seed=0), build_drafter(p.drafter, config, seed=1)


@pytest.mark.parametrize("models", ["tiny", "variant"])
@pytest.mark.parametrize("budget", [6, 12])  # more nodes than the depth: siblings, so accepted rows move
def test_lossless_with_long_accepted_paths(request, monkeypatch, models, budget):
    tiny = request.getfixturevalue(models)
    prompts = [encode(p) for p in PROMPTS]
    reference = decode_all(tiny, "ar", prompts)
    sequences = {i: prompts[i] + reference[i].tokens for i in range(len(prompts))}
    monkeypatch.setattr(engine.ddtree, "propose", oracle_propose(sequences, random.Random(budget)))
    results = decode_all(tiny, "ddtree", prompts, budget=budget)
    accepted = [n for r in results for n in r.accept_lengths]
    for got, want in zip(results, reference):
        assert got.tokens == want.tokens
        assert got.target_forwards < want.target_forwards
    depth = tiny[1].config.depth
    assert max(accepted) == depth and len(set(accepted)) >= 3  # full-depth and partial paths both ran
