"""Expert parallelism over real gloo ranks: each rank holds its slice of the experts, greedy
DDTree equals AR at every rank count with the same tokens on every rank, and the MoE's sum over
ranks is exact (so equal to the 1-rank layer's bits, and batch-invariant like it)."""

import pytest
import torch

from engine.config import preset
from engine.errors import EngineError
from engine.expert_parallel import ExpertParallel, ExpertShard
from engine.model import MoE
from engine.tokenizer import load_tokenizer
from engine.trained import load_target
from tests.engine.expert_parallel_ranks import decode_prompts, moe_layer, moe_outputs, run_ranks

TOK = load_tokenizer()
PROMPTS = ["Hello", "def f(x):\n    return x * 2\n", "The quick brown fox jumps over the lazy dog."]
N_EXPERTS = preset("tiny").model.n_routed_experts


def encode(text):
    return [TOK.bos_id] + TOK.encode(text)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return run_ranks(1, decode_prompts, "tiny", [encode(p) for p in PROMPTS], 20, 6,
                     folder=tmp_path_factory.mktemp("ranks1"))[0]


def test_one_rank_ddtree_equals_ar(one_rank):
    assert one_rank["ddtree"] == one_rank["ar"]
    assert one_rank["held_experts"] == list(range(N_EXPERTS))
    assert all(len(tokens) == 20 for tokens in one_rank["ar"])


@pytest.mark.parametrize("world", [2, 4])
def test_ddtree_equals_ar_on_every_rank(world, one_rank, tmp_path):
    results = run_ranks(world, decode_prompts, "tiny", [encode(p) for p in PROMPTS], 20, 6, folder=tmp_path)
    per_rank = N_EXPERTS // world
    for rank, result in enumerate(results):
        assert result["held_experts"] == list(range(rank * per_rank, (rank + 1) * per_rank))
        assert result["ddtree"] == result["ar"]  # lossless at this rank count
        assert result["ar"] == results[0]["ar"]  # the same tokens on every rank
        # The sum over ranks adds exact zeros, so the tokens are the 1-rank model's too.
        assert result["ar"] == one_rank["ar"]


def shard(rank, world):
    return ExpertParallel(ExpertShard(rank, world), timeout_s=1.0)


@pytest.mark.parametrize("world", [2, 4])
def test_the_ranks_slices_sum_to_the_whole_layer_exactly(world):
    """Per-expert (CPU) path: each rank's pair outputs are zero outside its experts, and adding the
    ranks' outputs in any order gives the whole layer's pair outputs bit for bit."""
    whole = moe_layer()
    x = torch.randn(37, whole.gate.weight.shape[1])
    weights, experts = whole.gate(x)
    parts = []
    for rank in range(world):
        part = moe_layer(shard(rank, world))
        assert torch.equal(part.gate.weight, whole.gate.weight)
        for e in part.experts.ids:
            assert torch.equal(part.experts[e].up_proj.weight, whole.experts[e].up_proj.weight)
        part.parallel = None  # no collective here: capture the rank's own pair outputs
        captured = []
        part.combine = lambda w, out, s, captured=captured: captured.append(out) or MoE.combine(w, out, s)
        part.per_expert(x, weights, experts, torch.zeros_like(x))
        parts.append(captured[0])
    full = []
    whole.combine = lambda w, out, s: full.append(out) or MoE.combine(w, out, s)
    whole.per_expert(x, weights, experts, torch.zeros_like(x))
    for order in (list(range(world)), list(reversed(range(world)))):
        total = torch.zeros_like(parts[0])
        for rank in order:
            total = total + parts[rank]
        assert torch.equal(total, full[0])


def test_checkpoint_load_reads_only_the_ranks_experts():
    whole = load_target("tiny")
    part = load_target("tiny", parallel=shard(1, 2))
    names = [n for n in part.state_dict() if ".mlp.experts." in n]
    assert {int(n.split(".")[5]) for n in names} == set(range(N_EXPERTS // 2, N_EXPERTS))
    whole_state = whole.state_dict()
    for name, tensor in part.state_dict().items():
        assert torch.equal(tensor, whole_state[name]), name
    assert len(part.state_dict()) == len(whole_state) - len(names) * (2 - 1)


@pytest.mark.parametrize("world, problem", [(16, "more ranks than"), (3, "do not divide evenly")])
def test_rank_counts_the_experts_cannot_split_into(world, problem):
    with pytest.raises(EngineError, match=problem):
        ExpertShard(0, world).experts(N_EXPERTS)


@pytest.mark.parametrize("world", [2, 4])
def test_the_all_reduced_layer_is_the_whole_layers_bits_alone_or_in_a_batch(world, tmp_path):
    """Real gloo ranks: each token's output, computed alone and inside a batch of 37, is bit for
    bit the 1-rank layer's, on every rank."""
    whole = moe_layer()
    x = torch.randn(37, whole.gate.weight.shape[1], generator=torch.Generator().manual_seed(5))
    want = whole(x)
    for batch, alone in run_ranks(world, moe_outputs, x, folder=tmp_path):
        assert torch.equal(batch, want) and torch.equal(alone, want)
