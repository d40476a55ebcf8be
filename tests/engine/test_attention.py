"""tree_attention against a float64 per-query reference, and its bit-exact invariances."""

import pytest
import torch

from engine.attention import KEY_CHUNK, tree_attention
from engine.tree import build_tree_cpu

H, ROPE, LATENT = 4, 8, 16
D = LATENT + ROPE


def random_block_mask(bs, budget, generator):
    """[bs, 1 + budget, 1 + budget] masks of real DDTree trees (root column all True)."""
    lq = torch.log_softmax(torch.randn(bs, 4, 6, generator=generator), -1).sort(-1, descending=True).values
    ids = torch.randint(0, 50, (bs, 4, 6), generator=generator)
    vis = build_tree_cpu(lq, ids, budget).visibility
    mask = torch.zeros(bs, budget + 1, budget + 1, dtype=torch.bool)
    mask[:, :, 0] = True
    mask[:, 1:, 1:] = vis
    return mask


def naive(q, kv, slots, prefix_lens, mask, scale):
    """Per query: softmax over its visible rows in float64, then the weighted latent rows."""
    bs, T = q.shape[:2]
    out = torch.zeros(bs, T, H, LATENT, dtype=torch.float64)
    for b in range(bs):
        p = int(prefix_lens[b])
        for t in range(T):
            rows = list(range(p)) + [p + j for j in range(T) if mask[b, t, j]]
            keys = kv[slots[b], rows].double()
            probs = torch.softmax(q[b, t].double() @ keys.T * scale, -1)
            out[b, t] = probs @ keys[:, :LATENT]
    return out


def make_inputs(prefix_lens, budget, seed, n_slots=6, max_len=200):
    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    q = torch.randn(bs, budget + 1, H, D, generator=gen)
    kv = torch.randn(n_slots, max_len, D, generator=gen)
    slots = torch.randperm(n_slots, generator=gen)[:bs]
    mask = random_block_mask(bs, budget, gen) if budget else torch.ones(bs, 1, 1, dtype=torch.bool)
    return q, kv, slots, torch.tensor(prefix_lens), mask


@pytest.mark.parametrize("prefix_lens,budget", [([0, 5, 70], 6), ([130, 1], 10), ([3], 1)])
def test_matches_float64_reference(prefix_lens, budget):
    q, kv, slots, prefix, mask = make_inputs(prefix_lens, budget, seed=budget)
    got = tree_attention(q, kv, slots, prefix, mask, 0.3, LATENT)
    assert got.shape == (len(prefix_lens), budget + 1, H, LATENT) and got.dtype == torch.float32
    want = naive(q, kv, slots, prefix, mask, 0.3)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_plain_decode_is_causal_attention():
    q, kv, slots, prefix, mask = make_inputs([KEY_CHUNK, 9], 0, seed=1)
    got = tree_attention(q, kv, slots, prefix, mask, 0.5, LATENT)
    for b in range(2):
        keys = kv[slots[b], : int(prefix[b]) + 1].double()
        want = torch.softmax(q[b, 0].double() @ keys.T * 0.5, -1) @ keys[:, :LATENT]
        torch.testing.assert_close(got[b, 0].double(), want, rtol=1e-5, atol=1e-5)


def test_node_equals_plain_decode_of_its_path_bitwise():
    """A node's output is bit-identical to decoding its path one token at a time (lossless DDTree)."""
    q, kv, slots, prefix, mask = make_inputs([KEY_CHUNK + 7], 12, seed=3, n_slots=2)
    got = tree_attention(q, kv, slots, prefix, mask, 0.2, LATENT)
    p, slot = int(prefix[0]), int(slots[0])
    other = 1 - slot
    for t in range(13):
        path = [j for j in range(13) if mask[0, t, j]]
        # Lay the prefix and the path's rows out contiguously in another slot, as plain decoding would.
        kv[other, :p] = kv[slot, :p]
        kv[other, p:p + len(path)] = kv[slot, [p + j for j in path]]
        plain = tree_attention(q[:, t:t + 1], kv, torch.tensor([other]), torch.tensor([p + len(path) - 1]),
                               torch.ones(1, 1, 1, dtype=torch.bool), 0.2, LATENT)
        assert torch.equal(plain[0, 0], got[0, t])


def test_request_alone_equals_request_in_batch_bitwise():
    q, kv, slots, prefix, mask = make_inputs([3, 150, 40, 0], 5, seed=4)
    batch = tree_attention(q, kv, slots, prefix, mask, 0.1, LATENT)
    for b in range(4):
        alone = tree_attention(q[b:b + 1], kv, slots[b:b + 1], prefix[b:b + 1], mask[b:b + 1], 0.1, LATENT)
        assert torch.equal(alone[0], batch[b])
