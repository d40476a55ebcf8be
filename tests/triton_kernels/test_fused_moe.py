"""fused_moe vs the per-expert loop it replaces on CUDA (engine.model.MoE.per_expert) and vs a
float64 per-token reference, with the default tilings and with each projection tiled its own way
(either GEMM's row tile the larger); the routing layout; edge cases; batch invariance; the tuned
tilings are the committed tuning run's picks.

Where each dtype runs: in the Triton interpreter on the CPU, float32 MoE layers (IEEE products,
~1e-5 against float64: the interpreter's bf16 `tl.dot` is broken); the `gpu` tests run bf16
(~1e-2) at Kimi K2's expert shapes (hidden 7168, intermediate 2048, top-8, one shared expert; 64
experts, not 384, to keep the test's memory small) and check a token's bits alone against the same
token inside batches of 2 to 1,088 random others, and that the layer never waits for the GPU.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.config import preset
from engine.model import MoE, init_random, materialize
from triton_kernels.fused_moe import (TUNED, MoeConfig, MoeTiles, fused_moe, gate_up_projection, max_blocks,
                                      moe_config, route_to_blocks)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEDS = [1, 2, int(torch.randint(2**31, ()))]  # the last drawn afresh at collection (the id replays it)
SMALL = dataclasses.replace(preset("tiny").model, hidden_size=96, moe_intermediate_size=48, n_routed_experts=10,
                            num_experts_per_tok=3, n_group=1, topk_group=1, torch_dtype="float32")
# Each projection its own tiling, either one's row tile the larger (the other walks it in sub-tiles);
# None: the default (one tiling for both in float32).
CONFIGS = [None, MoeConfig(gate_up=MoeTiles(16, 32, 32, 4, 2), down=MoeTiles(32, 16, 64, 4, 2)),
           MoeConfig(gate_up=MoeTiles(32, 16, 16, 4, 1), down=MoeTiles(16, 64, 32, 4, 2))]
RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fused_moe.json"


def moe_layer(config, seed, dtype=torch.float32, device=DEVICE) -> MoE:
    """An MoE layer with seeded weights, its experts stacked as the engine stacks them on CUDA."""
    with torch.device("meta"):
        moe = MoE(config).to(dtype)
    moe.stack_experts(device)
    materialize(moe, device)
    moe.gate.float()
    init_random(moe, seed, std=0.1)
    return moe.eval().requires_grad_(False)


def routed(moe: MoE, x: torch.Tensor, config: MoeConfig | None = None) -> torch.Tensor:
    weights, experts = moe.gate(x)
    return fused_moe(x, weights, experts, *moe.stacked(), moe.shared_experts(x), config)


def float64_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token through its chosen experts in float64 (routing taken from the layer's router)."""
    weights, experts = moe.gate(x)

    def mlp(m, t):
        g, u, d = (p.weight.double() for p in (m.gate_proj, m.up_proj, m.down_proj))
        return F.linear(F.silu(F.linear(t, g)) * F.linear(t, u), d)

    out = []
    for t, token in enumerate(x.double()):
        y = mlp(moe.shared_experts, token)
        for j in range(experts.shape[1]):
            y = y + weights[t, j].double() * mlp(moe.experts[int(experts[t, j])], token)
        out.append(y)
    return torch.stack(out) if out else x.double()[:0]


def relative_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def random_tokens(n, hidden, seed, dtype=torch.float32):
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 7, 40])
def test_matches_float64_and_the_per_expert_loop(seed, n, config):
    moe = moe_layer(SMALL, seed)
    x = random_tokens(n, SMALL.hidden_size, seed + 1)
    got = routed(moe, x, config)
    assert relative_error(got, float64_reference(moe, x)) < 1e-5
    weights, experts = moe.gate(x)
    assert relative_error(got, moe.per_expert(x, weights, experts, moe.shared_experts(x)).double()) < 1e-5


def test_routing_groups_pairs_by_expert_on_tile_boundaries():
    experts = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2]], device=DEVICE)  # expert 3 four times, 4 unused
    routing = route_to_blocks(experts, n_experts=5, block_m=2)
    n_blocks = max_blocks(8, 5, 2)
    assert routing.block_expert.shape == (n_blocks,) and routing.row_pair.shape == (n_blocks * 2,)
    # Experts in order, each on whole tiles: 0 -> pairs 1, 4; 1 -> 3 (+pad); 2 -> 7 (+pad); 3 -> 0, 2, 5, 6.
    assert routing.row_pair.tolist()[:10] == [1, 4, 3, -1, 7, -1, 0, 2, 5, 6]
    assert set(routing.row_pair.tolist()[10:]) <= {-1}
    assert routing.block_expert.tolist()[:5] == [0, 1, 2, 3, 3]
    assert set(routing.block_expert.tolist()[5:]) == {-1}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("n_experts, top_k", [(10, 3), (7, 1), (13, 4)])  # 7 and 13: no tile divides them
def test_edge_cases_match_float64(n_experts, top_k, config):
    layer = dataclasses.replace(SMALL, n_routed_experts=n_experts, num_experts_per_tok=top_k)
    moe = moe_layer(layer, 5)
    x = random_tokens(20, layer.hidden_size, 6)
    assert relative_error(routed(moe, x, config), float64_reference(moe, x)) < 1e-5
    empty = routed(moe, x[:0], config)
    assert empty.shape == (0, layer.hidden_size)
    # Every token choosing the same experts (the router's bias forces it); the rest chosen by none.
    moe.gate.e_score_correction_bias.zero_()[:top_k] = 100.0
    weights, experts = moe.gate(x)
    assert set(experts.flatten().tolist()) == set(range(top_k))
    assert relative_error(routed(moe, x, config), float64_reference(moe, x)) < 1e-5


def test_refuses_a_row_tile_that_does_not_divide_the_layouts():
    moe = moe_layer(SMALL, 1)
    x = random_tokens(3, SMALL.hidden_size, 2)
    routing = route_to_blocks(moe.gate(x)[1], SMALL.n_routed_experts, block_m=16)
    with pytest.raises(ValueError, match="does not divide"):
        gate_up_projection(x, routing, moe.stacked()[0], MoeTiles(32, 32, 32, 4, 2))


def test_each_projection_takes_the_tiling_of_its_own_shape():
    """At K2's expert shapes in bf16, gate+up ([E, 2I, H]) and down ([E, H, I]) take TUNED's entry
    for their own (N, K); float32 takes its IEEE tiling for both."""
    with torch.device("meta"):
        w13, w2 = torch.empty(4, 2 * 2048, 7168, dtype=torch.bfloat16), torch.empty(4, 7168, 2048, dtype=torch.bfloat16)
    assert moe_config(w13, w2) == MoeConfig(TUNED[2 * 2048, 7168], TUNED[7168, 2048])
    float32 = moe_config(w13.float(), w2.float())
    assert float32.gate_up == float32.down and float32.gate_up not in TUNED.values()


def test_tuned_tilings_are_the_committed_tuning_runs_picks():
    tuned = json.loads(RESULT.read_text()).get("tuned")
    assert tuned, f"{RESULT} holds no tuning run (benchmarks/fused_moe.py --tune)"
    if "tiles" in tuned:  # a run from before the projections were tuned apart: one tiling for both
        picks = {shape: MoeTiles(**tuned["tiles"]) for shape in TUNED}
    else:
        picks = {(pick["n"], pick["k"]): MoeTiles(**pick["tiles"]) for pick in tuned.values()}
    assert TUNED == picks


def test_refuses_weights_that_do_not_fit():
    moe = moe_layer(SMALL, 1)
    x = random_tokens(3, SMALL.hidden_size, 2)
    weights, experts = moe.gate(x)
    w13, w2 = moe.stacked()
    with pytest.raises(ValueError, match="do not fit"):
        fused_moe(x, weights, experts, w13, w2.transpose(1, 2), x)


def test_stacked_refuses_experts_that_are_no_longer_views():
    moe = moe_layer(SMALL, 1)
    moe.experts[0].gate_proj.weight = torch.nn.Parameter(moe.experts[0].gate_proj.weight.clone(), False)
    with pytest.raises(RuntimeError, match="not views"):
        moe.stacked()


K2_EXPERTS = dataclasses.replace(preset("k2-layer").model, n_routed_experts=64)


@pytest.mark.gpu
def test_k2_shapes_bf16_match_float64_on_gpu():
    moe = moe_layer(K2_EXPERTS, 3, dtype=torch.bfloat16)
    x = random_tokens(17, K2_EXPERTS.hidden_size, 4, torch.bfloat16)
    assert relative_error(routed(moe, x), float64_reference(moe, x)) < 1e-2


@pytest.mark.gpu
def test_a_token_alone_equals_the_token_among_others_on_gpu():
    moe = moe_layer(K2_EXPERTS, 7, dtype=torch.bfloat16)
    others = random_tokens(1088, K2_EXPERTS.hidden_size, 8, torch.bfloat16)
    token = random_tokens(1, K2_EXPERTS.hidden_size, 9, torch.bfloat16)
    alone = routed(moe, token)
    for n in (2, 8, 17, 64, 136, 544, 1088):
        for place in (0, n - 1):  # first and last: other places in the expert's row tile
            batch = torch.cat([others[:place], token, others[place:n - 1]])
            assert torch.equal(routed(moe, batch)[place], alone[0]), (n, place)


# bf16 tilings per projection at K2 shapes, either GEMM's row tile the larger (the other's sub-tiles compiled).
K2_CONFIGS = [MoeConfig(gate_up=MoeTiles(32, 128, 64, 4, 4), down=MoeTiles(64, 128, 64, 4, 3)),
              MoeConfig(gate_up=MoeTiles(64, 64, 128, 4, 3), down=MoeTiles(16, 64, 128, 4, 4))]


@pytest.mark.gpu
@pytest.mark.parametrize("config", K2_CONFIGS)
def test_tilings_per_projection_match_float64_and_stay_batch_invariant_on_gpu(config):
    moe = moe_layer(K2_EXPERTS, 5, dtype=torch.bfloat16)
    x = random_tokens(17, K2_EXPERTS.hidden_size, 6, torch.bfloat16)
    assert relative_error(routed(moe, x, config), float64_reference(moe, x)) < 1e-2
    others = random_tokens(1088, K2_EXPERTS.hidden_size, 8, torch.bfloat16)
    alone = routed(moe, x[:1], config)
    for n in (17, 136, 1088):
        for place in (0, n - 1):
            batch = torch.cat([others[:place], x[:1], others[place:n - 1]])
            assert torch.equal(routed(moe, batch, config)[place], alone[0]), (n, place)


@pytest.mark.gpu
def test_the_moe_layer_never_waits_for_the_gpu():
    moe = moe_layer(K2_EXPERTS, 2, dtype=torch.bfloat16)
    x = random_tokens(136, K2_EXPERTS.hidden_size, 3, torch.bfloat16)
    moe(x)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
