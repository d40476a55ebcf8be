"""KV compaction against a sequential reference; slot allocation and capacity."""

import pytest
import torch

from engine.kv_cache import LatentKVCache, compact_accepted


def test_compaction_matches_sequential_moves():
    gen = torch.Generator().manual_seed(0)
    layers, n_slots, max_len, dim = 3, 5, 40, 6
    kv = torch.randn(layers, n_slots, max_len, dim, generator=gen)
    slots = torch.tensor([4, 0, 2, 3])
    prefix_lens = torch.tensor([0, 7, 20, 3])
    # Increasing node indices along each path (parents come before children); overlapping moves.
    accepted = torch.tensor([[0, 1, 2, 3], [2, 5, 9, -1], [-1, -1, -1, -1], [1, 2, 8, 9]])
    accept_len = torch.tensor([4, 3, 0, 4])
    want = kv.clone()
    for b in range(4):
        for j in range(int(accept_len[b])):  # increasing j never reads a row it already overwrote
            base = int(prefix_lens[b]) + 1
            want[:, slots[b], base + j] = want[:, slots[b], base + int(accepted[b, j])]
    compact_accepted(kv, slots, prefix_lens, accepted, accept_len)
    assert torch.equal(kv, want)


def test_compaction_reads_all_sources_before_writing():
    kv = torch.arange(10.0).reshape(1, 1, 10, 1)
    # Row 2 moves to 1 while row 3 moves to 2: a copy that wrote first would duplicate row 2.
    compact_accepted(kv, torch.tensor([0]), torch.tensor([0]), torch.tensor([[1, 2]]), torch.tensor([2]))
    assert kv.flatten().tolist()[:3] == [0.0, 2.0, 3.0]


def test_slot_allocation_and_capacity():
    cache = LatentKVCache(2, 3, 16, 4)
    assert cache.kv.shape == (2, 3, 16, 4) and cache.can_hold(16) and not cache.can_hold(17)
    assert [cache.allocate() for _ in range(3)] == [0, 1, 2]
    assert cache.n_free == 0 and not cache.can_hold(1)
    with pytest.raises(RuntimeError, match="no free KV slot"):
        cache.allocate()
    cache.release(1)
    with pytest.raises(RuntimeError, match="not allocated"):
        cache.release(1)
    assert cache.allocate() == 1


def test_compaction_with_nothing_accepted_changes_nothing():
    kv = torch.randn(2, 3, 8, 4)
    before = kv.clone()
    compact_accepted(kv, torch.tensor([2, 0]), torch.tensor([1, 3]), torch.full((2, 3), -1), torch.zeros(2, dtype=torch.int64))
    assert torch.equal(kv, before)
