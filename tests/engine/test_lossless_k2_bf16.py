"""Greedy DDTree == AR at Kimi K2's layer shapes in bf16 on the GPU (issue 29's probe as tests).

cuBLAS picks its GEMM by row count, so before the batch-invariant kernels a verify block's root row
(bs * (1 + budget) rows) differed from the AR step's row (bs rows) at these shapes: 0 of 16 bit-
identical, and DDTree kept AR's tokens for 10 of 64 requests. The model is k2-layer's shapes with
fewer experts and a smaller vocabulary (32 experts, 32,768 tokens) to keep the test's memory small;
random weights, so drafts are almost never accepted and verify's root row decides every token.
"""

import dataclasses

import pytest
import torch

from engine.config import preset
from engine.drafter import build_drafter
from engine.engine import Engine
from engine.model import build_target

pytestmark = pytest.mark.gpu

K2 = preset("k2-layer")
CONFIG = dataclasses.replace(K2.model, n_routed_experts=32, vocab_size=32768)
PROMPT_LENGTHS = [8, 13, 21, 34, 55, 89, 144, 200, 9, 17, 29, 47, 76, 123, 160, 190]  # 16 prompts, 8-200 tokens
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def models():
    target = build_target(CONFIG, seed=11, device="cuda")
    drafter = build_drafter(K2.drafter, CONFIG, seed=12, device="cuda", dtype=target.dtype)
    return target, drafter


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, CONFIG.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def decode(models, prompts, mode, budget=8, builder="cpu"):
    target, drafter = models
    engine = Engine(target, drafter, budget=budget, builder=builder, mode=mode, n_slots=len(prompts),
                    max_len=max(map(len, prompts)) + NEW_TOKENS + budget + 1, nvtx=False)
    for i, prompt in enumerate(prompts):
        engine.admit(i, prompt, NEW_TOKENS)
    while engine.active:
        engine.step()
    return [engine.result(i).tokens for i in range(len(prompts))]


@pytest.fixture(scope="module")
def reference(models, prompts):
    return decode(models, prompts, "ar")


def test_a_verify_blocks_root_row_is_the_ar_step_bit_for_bit(models, prompts):
    """The probe: same cache, same token; the AR step's logits against the root row of a verify
    block of 1 + 16 rows per request (the other rows random tokens hanging off the root)."""
    target, _ = models
    bs, budget = len(prompts), 16
    max_len = max(map(len, prompts)) + budget + 2
    kv = torch.zeros(CONFIG.num_hidden_layers, bs, max_len, CONFIG.kv_lora_rank + CONFIG.qk_rope_head_dim,
                     dtype=target.dtype, device="cuda")
    bonus = []
    for slot, prompt in enumerate(prompts):
        logits, _ = target.prefill(torch.tensor(prompt[:-1], device="cuda"), kv, slot)
        bonus.append(prompt[-1])
    slots = torch.arange(bs, device="cuda")
    prefix = torch.tensor([len(p) - 1 for p in prompts], device="cuda")
    tokens = torch.tensor(bonus, device="cuda")[:, None]
    ar, _ = target.forward_block(tokens, prefix[:, None], kv.clone(), slots, prefix,
                                 torch.ones(bs, 1, 1, dtype=torch.bool, device="cuda"))
    gen = torch.Generator().manual_seed(6)
    block = torch.cat([tokens.cpu(), torch.randint(0, CONFIG.vocab_size, (bs, budget), generator=gen)], 1).cuda()
    mask = torch.eye(budget + 1, dtype=torch.bool, device="cuda").expand(bs, -1, -1).clone()
    mask[:, :, 0] = True  # every node hangs off the root
    positions = prefix[:, None] + (torch.arange(budget + 1, device="cuda") > 0)
    verify, _ = target.forward_block(block, positions, kv.clone(), slots, prefix, mask)
    assert torch.equal(verify[:, 0], ar[:, 0])


@pytest.mark.parametrize("builder", ["cpu", "gpu"])
@pytest.mark.parametrize("budget", [8, 16, 32])
def test_ddtree_batch_equals_ar(models, prompts, reference, builder, budget):
    got = decode(models, prompts, "ddtree", budget=budget, builder=builder)
    same = sum(g == r for g, r in zip(got, reference))
    assert same == len(prompts), f"{same} of {len(prompts)} requests kept AR's tokens"
    assert all(len(tokens) == NEW_TOKENS for tokens in got)


def test_requests_alone_equal_ar_in_a_batch(models, prompts, reference):
    for i in (0, 7, 15):  # the shortest, the longest, and one between
        assert decode(models, [prompts[i]], "ddtree", budget=16, builder="gpu")[0] == reference[i]
        assert decode(models, [prompts[i]], "ar")[0] == reference[i]
