"""The block drafter: proposal shapes and normalisation, trainability, save/load."""

import pytest
import torch

from engine import drafter as drafter_module
from engine.config import preset
from engine.drafter import CONTEXT_BUCKET, Drafter, DrafterCache, build_drafter, propose

P = preset("tiny")


def test_proposals_are_normalised_top_k_log_probs(tiny):
    target, drafter = tiny
    cache = DrafterCache(drafter, n_slots=3, rows=64)
    slots, lengths = torch.tensor([2, 0]), torch.tensor([9, 4])
    features = torch.randn(2, 9, target.config.hidden_size * len(drafter.config.target_layer_ids))
    cache.append(drafter, slots, features, torch.arange(9).expand(2, 9))
    log_probs, ids = propose(drafter, target, cache, slots, lengths, torch.tensor([65, 66]), top_k=5)
    depth = drafter.config.depth
    assert log_probs.shape == ids.shape == (2, depth, 5)
    assert (log_probs <= 0).all() and (log_probs.diff(dim=-1) <= 0).all()
    assert (ids.sort(-1).values.diff(dim=-1) > 0).all()  # distinct tokens per depth
    # top-k of a full distribution: K = vocab recovers probabilities summing to one.
    full, _ = propose(drafter, target, cache, slots, lengths, torch.tensor([65, 66]), top_k=target.config.vocab_size)
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(2, depth))
    # Context rows past a request's length are invisible.
    cache.kv[:, 0, 4:] = 1e3
    again, _ = propose(drafter, target, cache, slots, lengths, torch.tensor([65, 66]), top_k=5)
    torch.testing.assert_close(again, log_probs)


def test_forward_is_differentiable(tiny):
    target, _ = tiny
    drafter = build_drafter(P.drafter, P.model, seed=4).requires_grad_(True)
    features = torch.randn(2, 6, P.model.hidden_size * len(P.drafter.target_layer_ids))
    context = drafter.context_kv(features, torch.arange(6).expand(2, 6))
    block = target.embed(torch.tensor([[65] + [P.drafter.mask_token_id] * P.drafter.depth] * 2))
    hidden = drafter(block, torch.arange(6, 6 + P.drafter.block_size).expand(2, -1), context,
                     torch.ones(2, 6, dtype=torch.bool))
    loss = torch.nn.functional.cross_entropy(target.logits(hidden[:, 1:]).flatten(0, 1),
                                             torch.randint(0, 256, (2 * P.drafter.depth,)))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.parameters())


def test_save_and_load_round_trip(tmp_path):
    drafter = build_drafter(P.drafter, P.model, seed=9)
    drafter.save(str(tmp_path / "drafter.safetensors"))
    loaded = Drafter.load(str(tmp_path / "drafter.safetensors"))
    assert loaded.config == drafter.config and loaded.target_config == drafter.target_config
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_saving_the_same_drafter_gives_the_same_bytes(tmp_path):
    drafter = build_drafter(P.drafter, P.model, seed=9)
    paths = [tmp_path / f"drafter{i}.safetensors" for i in range(8)]
    for path in paths:  # each save builds a fresh metadata map (hash order differed between maps)
        drafter.save(str(path))
    assert len({path.read_bytes() for path in paths}) == 1


def test_context_comes_in_buckets_and_the_padding_changes_nothing(tiny, monkeypatch):
    target, drafter = tiny
    cache = DrafterCache(drafter, n_slots=2, rows=CONTEXT_BUCKET + 40)
    slots, lengths = torch.tensor([1, 0]), torch.tensor([CONTEXT_BUCKET + 3, 7])
    n = int(lengths.max())
    features = torch.randn(2, n, target.config.hidden_size * len(drafter.config.target_layer_ids))
    cache.append(drafter, slots, features, torch.arange(n).expand(2, n))
    context, valid = cache.context(slots, lengths)
    assert context.shape[2] == valid.shape[1] == CONTEXT_BUCKET + 40  # rounded up, capped by the cache
    assert valid.sum(1).tolist() == lengths.tolist()
    padded = propose(drafter, target, cache, slots, lengths, torch.tensor([65, 66]), top_k=5)
    monkeypatch.setattr(drafter_module, "CONTEXT_BUCKET", 1)
    assert cache.context(slots, lengths)[0].shape[2] == n
    exact = propose(drafter, target, cache, slots, lengths, torch.tensor([65, 66]), top_k=5)
    torch.testing.assert_close(padded, exact)


def test_a_file_without_the_configs_entry_is_refused_in_one_line(tmp_path):
    from safetensors.torch import save_file

    from engine.errors import EngineError

    drafter = build_drafter(P.drafter, P.model, seed=9)
    path = tmp_path / "two_entries.safetensors"  # the layout drafters had before: two config entries
    save_file(dict(drafter.state_dict()), str(path), metadata={"drafter_config": "{}", "target_config": "{}"})
    with pytest.raises(EngineError, match="no 'configs' in its metadata"):
        Drafter.load(str(path))


def test_attention_never_runs_through_cudnn(tiny, monkeypatch):
    """cuDNN's attention plans every new shape (49-81 ms of host time each on the H200): the drafter
    turns it off around its attention, and leaves the global setting as it was."""
    target, drafter = tiny
    seen = []
    real = drafter_module.F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(drafter_module.F, "scaled_dot_product_attention", recording)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    cache = DrafterCache(drafter, n_slots=1, rows=32)
    features = torch.randn(1, 5, target.config.hidden_size * len(drafter.config.target_layer_ids))
    cache.append(drafter, torch.tensor([0]), features, torch.arange(5)[None])
    propose(drafter, target, cache, torch.tensor([0]), torch.tensor([5]), torch.tensor([65]), top_k=3)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
