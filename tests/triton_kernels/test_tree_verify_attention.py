"""tree_verify_attention vs a float64 per-query reference and vs `engine.attention.tree_attention`.

Where each kernel and dtype runs: in the Triton interpreter on the CPU the portable kernel gets
float32 inputs (bf16 `tl.dot` is broken there), float32 products in IEEE mode, so it must match
float64 to ~1e-5. The `gpu` tests run compiled kernels at K2 dims (64 heads, 512 latent + 64 rope)
against the float64 reference: bfloat16 inputs (relative error <= 1e-2) take the Hopper kernel on
an H200 (tree_verify_attention_hopper, Gluon: it cannot run in the interpreter), float32 inputs
(<= 1e-5) the portable one; the Hopper kernel is also forced on smaller shapes. Both tiers check
that a tree node's output is bit-identical to plain decoding of its path.
"""

import pytest
import torch

from engine.attention import tree_attention
from engine.tree import build_tree_cpu
import triton_kernels.tree_verify_attention as tva
from triton_kernels.tree_verify_attention import default_num_splits, tree_verify_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def block_mask(bs, budget, generator):
    """[bs, 1 + budget, 1 + budget] masks of real DDTree trees (root column all True)."""
    lq = torch.log_softmax(torch.randn(bs, 6, 8, generator=generator), -1).sort(-1, descending=True).values
    vis = build_tree_cpu(lq, torch.randint(0, 50, (bs, 6, 8), generator=generator), budget).visibility
    mask = torch.zeros(bs, budget + 1, budget + 1, dtype=torch.bool)
    mask[:, :, 0] = True
    mask[:, 1:, 1:] = vis
    return mask


def make_inputs(prefix_lens, budget, heads, latent, rope, seed, n_slots=None, max_len=None):
    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    n_slots = n_slots or bs + 2
    max_len = max_len or max(prefix_lens) + budget + 1
    q = torch.randn(bs, budget + 1, heads, latent + rope, generator=gen)
    kv = torch.randn(n_slots, max_len, latent + rope, generator=gen)
    slots = torch.randperm(n_slots, generator=gen)[:bs]
    mask = block_mask(bs, budget, gen) if budget else torch.ones(bs, 1, 1, dtype=torch.bool)
    return q, kv, slots, torch.tensor(prefix_lens), mask


def float64_reference(q, kv, slots, prefix_lens, mask, scale, latent):
    """Softmax over each query's visible rows (prefix + its masked block) in float64, on q's device."""
    q, kv = q.double(), kv.double()
    bs, T, heads, dim = q.shape
    out = torch.zeros(bs, T, heads, latent, dtype=torch.float64, device=q.device)
    for b in range(bs):
        p = int(prefix_lens[b])
        keys = kv[int(slots[b]), :p + T]
        visible = torch.cat([torch.ones(T, p, dtype=torch.bool, device=q.device), mask[b].to(q.device)], -1)
        scores = (q[b] @ keys.T * scale).masked_fill(~visible[:, None, :], float("-inf"))
        out[b] = torch.softmax(scores, -1) @ keys[:, :latent]
    return out


def rel_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def run(inputs, scale, latent, dtype, **kw):
    q, kv, slots, prefix, mask = inputs
    return tree_verify_attention(q.to(DEVICE, dtype), kv.to(DEVICE, dtype), slots.to(DEVICE), prefix.to(DEVICE),
                                 mask.to(DEVICE), scale, latent, **kw)


@pytest.mark.parametrize("splits,block_n", [(1, 64), (3, 16)])
@pytest.mark.parametrize("prefix_lens,budget", [([0, 5, 70], 6), ([40], 0), ([33, 2], 10)])
def test_float32_matches_float64_reference(prefix_lens, budget, splits, block_n):
    inputs = make_inputs(prefix_lens, budget, heads=4, latent=32, rope=16, seed=budget + splits)
    got = run(inputs, 0.3, 32, torch.float32, num_splits=splits, block_n=block_n)
    assert got.shape == (len(prefix_lens), budget + 1, 4, 32) and got.dtype == torch.float32
    assert rel_error(got.cpu(), float64_reference(*inputs, 0.3, 32)) < 1e-5
    assert rel_error(got.cpu(), tree_attention(*inputs, 0.3, 32).double()) < 1e-5


def test_many_splits_with_odd_head_counts_merge_to_the_float64_reference():
    # 5 heads (a merge tile runs past the last head), 9 splits of 16 keys (most of them empty).
    inputs = make_inputs([20, 100], 4, heads=5, latent=16, rope=16, seed=7)
    got = run(inputs, 0.3, 16, torch.float32, num_splits=9, block_n=16)
    assert rel_error(got.cpu(), float64_reference(*inputs, 0.3, 16)) < 1e-5


def node_equals_plain_decode(heads, latent, rope, prefix, budget, dtype, splits, seed, block_n=64):
    """Verify a tree, then decode each node's path alone from a compacted copy: outputs must be equal."""
    q, kv, slots, prefix_lens, mask = make_inputs([prefix], budget, heads, latent, rope, seed, n_slots=2)
    slot = int(slots[0])
    tree_out = run((q, kv, slots, prefix_lens, mask), 0.2, latent, dtype, num_splits=splits, block_n=block_n)
    for t in range(budget + 1):
        path = mask[0, t].nonzero().flatten()
        plain_kv = kv.clone()
        plain_kv[1 - slot, :prefix] = kv[slot, :prefix]
        plain_kv[1 - slot, prefix:prefix + len(path)] = kv[slot, prefix + path]
        plain = run((q[:, t:t + 1], plain_kv, torch.tensor([1 - slot]), torch.tensor([prefix + len(path) - 1]),
                     torch.ones(1, 1, 1, dtype=torch.bool)), 0.2, latent, dtype, num_splits=splits, block_n=block_n)
        assert torch.equal(plain[0, 0], tree_out[0, t]), f"node {t} differs from plain decode of its path"


@pytest.mark.parametrize("splits", [1, 2, 9])  # 9: merged by the many-splits kernel
def test_node_equals_plain_decode_of_its_path_bitwise(splits):
    # 16-key chunks: the prefix spans whole chunks, then a chunk shared with tree rows.
    node_equals_plain_decode(heads=4, latent=32, rope=16, prefix=45, budget=9, dtype=torch.float32,
                             splits=splits, seed=splits, block_n=16)


@pytest.mark.parametrize("bs,T,max_len,want", [
    (1, 1, 32769, 103),  # one query: 103 five-chunk splits (320 keys) cover 32769 keys
    (1, 1, 4097, 65),  # one chunk each (the last holds one key)
    (1, 9, 4105, 13),  # 117 programs of 5 chunks
    (8, 1, 16385, 13),
    (8, 17, 4113, 4),  # 544 programs: the short last split fills the fifth wave's tail
    (1, 17, 4113, 8),  # 136 programs, the last 17 of 2 chunks
    (64, 1, 4097, 2),  # 128 programs
    (64, 33, 32801, 1),  # 2112 queries fill 16 waves exactly
    (1, 1, 40, 1),  # shorter than a chunk
])
def test_default_split_counts(monkeypatch, bs, T, max_len, want):
    monkeypatch.setattr(tva, "_sm_count", lambda index: 132)  # an H200; the rule is host arithmetic
    assert default_num_splits(bs, T, max_len, torch.device("cuda", 0)) == want


def test_an_empty_batch_gives_an_empty_output():
    q, kv = torch.randn(0, 3, 4, 48), torch.randn(2, 64, 48)
    none = torch.zeros(0, dtype=torch.int64)
    out = tree_verify_attention(q, kv, none, none, torch.zeros(0, 3, 3, dtype=torch.bool), 0.1, 32)
    assert out.shape == (0, 3, 4, 32) and out.dtype == q.dtype


def test_unknown_or_unavailable_kernels_are_refused():
    inputs = make_inputs([3], 2, heads=2, latent=32, rope=16, seed=0)
    with pytest.raises(ValueError, match="kernel 'fast'"):
        run(inputs, 0.1, 32, torch.float32, kernel="fast")
    with pytest.raises(ValueError, match="Hopper kernel needs"):
        run(inputs, 0.1, 32, torch.float32, kernel="hopper")  # float32 rows (and no sm_90 GPU on the CPU)


def test_bad_shapes_are_refused():
    q, kv, slots, prefix, mask = make_inputs([3], 2, heads=2, latent=32, rope=16, seed=0)
    with pytest.raises(ValueError, match="v_dim 24"):
        tree_verify_attention(q, kv, slots, prefix, mask, 0.1, 24)
    with pytest.raises(ValueError, match="tree_mask"):
        tree_verify_attention(q, kv, slots, prefix, mask[:, :2, :2], 0.1, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
@pytest.mark.parametrize("prefix_lens,budget", [([4096, 17, 1000, 2500], 32), ([5000], 0), ([1, 700, 3000], 8)])
def test_k2_dims_match_float64_on_gpu(prefix_lens, budget, dtype, tolerance):
    inputs = make_inputs(prefix_lens, budget, heads=64, latent=512, rope=64, seed=budget)
    inputs = tuple(x.to(DEVICE) for x in inputs)
    want = float64_reference(*inputs, 0.07, 512)
    if dtype == torch.bfloat16:  # the reference sees the same rounded inputs
        want = float64_reference(*(x.to(dtype) if x.is_floating_point() else x for x in inputs), 0.07, 512)
    for splits in (None, 1, 5, 12):  # 12: the many-splits merge
        got = run(inputs, 0.07, 512, dtype, num_splits=splits)
        assert got.dtype == dtype and rel_error(got, want) <= tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4, 16])
def test_k2_node_equals_plain_decode_bitwise_on_gpu(splits):
    # prefix % 64 = 62: deeper nodes' plain decode reads the last prefix chunk as a full chunk.
    node_equals_plain_decode(heads=64, latent=512, rope=64, prefix=3006, budget=16, dtype=torch.bfloat16,
                             splits=splits, seed=splits)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,latent,rope", [(16, 128, 32), (64, 512, 64), (5, 64, 16)])
@pytest.mark.parametrize("prefix_lens,budget,splits", [([300, 7, 90], 8, 1), ([1000], 0, 3), ([64, 129], 16, 2)])
def test_hopper_kernel_matches_float64_on_gpu(heads, latent, rope, prefix_lens, budget, splits):
    inputs = make_inputs(prefix_lens, budget, heads=heads, latent=latent, rope=rope, seed=heads + budget)
    inputs = tuple(x.to(DEVICE).to(torch.bfloat16) if x.is_floating_point() else x.to(DEVICE) for x in inputs)
    want = float64_reference(*inputs, 0.1, latent)
    q, rest = inputs[0], inputs[1:]
    # float32 queries: a float32 output (and float32 partials) staged through the same shared memory
    for block_n, q_dtype in ((32, torch.bfloat16), (64, torch.bfloat16), (64, torch.float32)):
        got = tree_verify_attention(q.to(q_dtype), *rest, 0.1, latent, num_splits=splits, block_n=block_n,
                                    kernel="hopper")
        assert got.dtype == q_dtype and rel_error(got, want) <= 1e-2
