"""Training: a few seeded steps on `tiny` lower the loss, distillation data is the target's own greedy
output, and the CLI writes loadable checkpoints with the exact command beside them."""

import json

import pytest
import torch

from engine import corpus
from engine.__main__ import main
from engine.config import preset
from engine.drafter import Drafter, build_drafter
from engine.errors import EngineError
from engine.model import MoE, build_target, plain_matmuls
from engine.tokenizer import load_tokenizer
from engine.train_drafter import Recipe as DrafterRecipe
from engine.train_drafter import make_distillation, save_drafter, train_drafter
from engine.train_target import Recipe as TargetRecipe
from engine.train_target import save_target, train_target
from engine.trained import load_target

TOKENIZER = load_tokenizer()
TINY = preset("tiny")


def test_target_loss_decreases_and_routers_rebalance():
    model, losses = train_target(TINY.model, TOKENIZER, TargetRecipe(steps=25, batch_size=4, seq_len=64),
                                 lr=3e-3, seed=0)
    assert len(losses) == 25 and sum(losses[-5:]) / 5 < losses[0] - 0.5
    biases = [layer.mlp.gate.e_score_correction_bias for layer in model.model.layers if isinstance(layer.mlp, MoE)]
    assert biases and all(b.abs().sum() > 0 for b in biases)  # the load-balancing bias moved from zero
    _, same = train_target(TINY.model, TOKENIZER, TargetRecipe(steps=2, batch_size=4, seq_len=64), lr=3e-3, seed=0)
    assert same == losses[:2]  # seeded: the same run gives the same losses


@pytest.fixture(scope="module")
def distillation():
    # The committed target: a random one's lm_head is too flat for a few steps to show learning.
    target = load_target("tiny")
    recipe = DrafterRecipe(steps=20, prompts=6, min_prompt=8, max_prompt=24, continuation=20, sequences=3,
                           anchors=8)
    data = make_distillation(target, TINY.drafter.target_layer_ids, TOKENIZER, "train", recipe.prompts, recipe,
                             torch.Generator().manual_seed(0))
    return target, recipe, data


def test_distillation_labels_are_the_targets_greedy_continuation(distillation):
    target, recipe, data = distillation
    assert data.teacher_agreement > 0.99  # the causal forward's argmax reproduces the engine's greedy tokens
    for i in range(len(data.tokens)):
        p, n = int(data.prompt_lens[i]), int(data.lengths[i])
        assert n - p == recipe.continuation and data.tokens[i, 0] == TOKENIZER.bos_id
        assert bool((data.tokens[i, n:] == TOKENIZER.pad_id).all())
    with torch.no_grad(), plain_matmuls():  # features are the target's hidden states at the drafter's layers
        _, features = target.forward_causal(data.tokens[:1], TINY.drafter.target_layer_ids)
    want = features[0, :int(data.lengths[0])]
    # Stored in bf16: equal up to one bf16 rounding step (the batched forward may round differently).
    assert torch.allclose(want.to(torch.bfloat16).float(), data.features[0].float(), rtol=2 ** -7, atol=1e-6)


def test_drafter_loss_decreases(distillation):
    target, recipe, data = distillation
    drafter, losses = train_drafter(target, "tiny", data, recipe, lr=3e-3, seed=0)
    assert len(losses) == 20 and sum(losses[-5:]) / 5 < losses[0] - 2
    assert not any(p.requires_grad for p in target.parameters())  # the target stays frozen


def test_cli_writes_checkpoints_and_the_exact_command(tmp_path):
    assert main(["train-target", "--model", "tiny", "--steps", "2", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "train-target.json").read_text())
    assert record["command"] == f"python -m engine train-target --model tiny --steps 2 --out {tmp_path}"
    assert record["seed"] == 0 and record["corpus"]["split"] == "train" and record["steps"] == 2
    assert set(record["corpus"]["held_out_files"]) == {p.name for p in corpus.files("held-out")}
    load_target("tiny", directory=tmp_path / "target")  # checks the stored config is the preset's
    assert main(["train-drafter", "--model", "tiny", "--steps", "2", "--prompts", "2", "--held-out-prompts", "2",
                 "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "train-drafter.json").read_text())
    assert record["command"].startswith("python -m engine train-drafter --model tiny")
    assert len(record["held_out"]["per_depth_top1"]) == TINY.drafter.depth
    drafter = Drafter.load(str(tmp_path / "drafter.safetensors"))
    assert drafter.config == TINY.drafter
    # a new target makes the drafter distilled from the old one stale: it goes, record and all
    assert main(["train-target", "--model", "tiny", "--steps", "1", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "drafter.safetensors").exists() and not (tmp_path / "train-drafter.json").exists()


def test_an_output_folder_that_cannot_be_written_is_refused_before_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    assert main(["train-target", "--model", "tiny", "--steps", "1", "--out", str(blocker / "pair")]) == 2
    assert capsys.readouterr().err.startswith(f"engine: error: --out {blocker / 'pair'}: cannot write there")


def test_bad_arguments_are_one_line_errors(capsys):
    assert main(["train-target", "--model", "tiny", "--steps", "0"]) == 2
    assert capsys.readouterr().err == "engine: error: --steps must be at least 1 (got 0)\n"


def test_training_forward_is_the_engines_model():
    """forward_causal (fused attention, plain GEMMs) computes what prefill computes for the engine."""
    target = build_target(TINY.model, seed=3)
    tokens = torch.randint(0, TINY.model.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    kv = torch.zeros(TINY.model.num_hidden_layers, 1, 64, TINY.model.latent_dim)
    with torch.no_grad():
        last, _ = target.prefill(tokens[1], kv, 0)
        with plain_matmuls():
            logits, _ = target.forward_causal(tokens)
    assert torch.allclose(logits[1, -1], last, atol=1e-5, rtol=1e-4)


def test_packed_training_blocks_are_what_the_engine_drafts(distillation):
    """Training packs several blocks of a sequence into one drafter row; each must come out exactly as
    the engine's own `propose` drafts that block from the drafter's cache."""
    from engine.drafter import DrafterCache, build_drafter, propose
    from engine.train_drafter import block_logits

    target, _, data = distillation
    drafter = build_drafter(TINY.drafter, TINY.model, seed=1)
    p = int(data.prompt_lens[1])
    anchors = torch.tensor([[p + 4, p, p + 9], [int(data.prompt_lens[2]), p, p + 1]])
    with torch.no_grad(), plain_matmuls():
        logits, labels = block_logits(drafter, target, data, torch.tensor([1, 2]), anchors)
    for i, a in enumerate(anchors[0].tolist()):
        cache = DrafterCache(drafter, 1, 128)
        with torch.no_grad():
            cache.append(drafter, torch.tensor([0]), data.features[1][None, :a].float(), torch.arange(a)[None])
            top_lp, top_ids = propose(drafter, target, cache, torch.tensor([0]), torch.tensor([a]),
                                      data.tokens[1, a:a + 1], top_k=4)
        want = logits[i].log_softmax(-1).topk(4, dim=-1)
        assert torch.equal(want.indices, top_ids[0]) and torch.allclose(want.values, top_lp[0], atol=1e-5)
        assert labels[i].tolist() == data.tokens[1, a + 1:a + 1 + TINY.drafter.depth].tolist()


def test_a_diverged_run_saves_nothing(tmp_path):
    """NaN weights would overwrite a good checkpoint (by default the committed one) with garbage."""
    config = preset("tiny")
    target = build_target(config.model, seed=0)
    drafter = build_drafter(config.drafter, config.model, seed=1)
    with torch.no_grad():
        next(target.parameters()).fill_(float("nan"))
        next(drafter.parameters()).fill_(float("inf"))
    with pytest.raises(EngineError, match="not saved to .*holds NaN or Inf"):
        save_target(target, tmp_path / "target", TOKENIZER)
    with pytest.raises(EngineError, match="not saved to .*holds NaN or Inf"):
        save_drafter(drafter, tmp_path / "drafter.safetensors")
    assert list(tmp_path.iterdir()) == []
