"""`--moe-layers N`: a random-weight preset N MoE layers deep (issue 28's expert-parallel runs go as
deep as the ranks' memory allows). The deeper model is a real model: every added layer is an MoE
layer, and greedy DDTree still gives AR's tokens; trained weights and checkpoints keep their depth."""

import subprocess
import sys

import pytest

from engine.config import preset, with_moe_layers
from engine.errors import EngineError
from engine.generate import generate, load_models, preset_with_moe_layers
from engine.model import MoE
from engine.tokenizer import load_tokenizer
from tests.engine.test_cli_errors import ROOT, assert_one_line, engine

K2_SERVE = ["serve", "--workload", "chat", "--model", "k2-layer", "--requests", "4", "--device", "cpu", "--check"]


def test_a_deeper_random_preset_has_only_moe_layers_after_its_dense_ones_and_stays_lossless():
    target, drafter = load_models("tiny", seed=0, device="cpu", random_weights=True, moe_layers=3)
    assert target.config.num_hidden_layers == 4
    assert [isinstance(layer.mlp, MoE) for layer in target.model.layers] == [False, True, True, True]
    prompts = [load_tokenizer().encode(text) for text in ("def add(a, b):", "import os\nimport")]
    ddtree = generate(target, drafter, prompts, mode="ddtree", budget=8, max_new_tokens=12, nvtx=False)
    ar = generate(target, drafter, prompts, mode="ar", max_new_tokens=12, nvtx=False)
    assert [r.tokens for r in ddtree] == [r.tokens for r in ar] and all(len(r.tokens) == 12 for r in ar)


def test_the_count_must_leave_the_drafters_target_layers_in_place():
    k2 = preset("k2-layer")  # 1 dense layer; the drafter reads target layers 1 and 2
    assert with_moe_layers(k2, 40).model.num_hidden_layers == 41
    assert with_moe_layers(k2, 2).model == k2.model
    with pytest.raises(EngineError, match="reads target layer 2, so it needs at least 2 MoE layers"):
        with_moe_layers(k2, 1)


def test_a_checkpoint_keeps_its_own_layers():
    with pytest.raises(EngineError, match="not with --weights"):
        preset_with_moe_layers("tiny", 3, weights="engine/assets/tiny/target")


@pytest.mark.parametrize("args, fragments", [
    (K2_SERVE + ["--moe-layers", "0"], ["--moe-layers must be at least 1 (got 0)"]),
    (K2_SERVE + ["--moe-layers", "1"], ["--moe-layers 1", "needs at least 2 MoE layers"]),
    (["serve", "--workload", "chat", "--model", "small", "--moe-layers", "6", "--check"],
     ["preset small loads its trained weights"]),
])
def test_serve_refuses_a_count_it_cannot_serve_in_one_line(args, fragments):
    assert_one_line(engine(*args), *fragments)


def test_serve_checks_a_deep_k2_layer_across_ranks_without_loading_it():
    done = engine(*K2_SERVE, "--moe-layers", "24", "--ranks", "8")
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_capture_passes_the_count_on_to_the_engine(tmp_path):
    from ddprof.capture import CaptureRequest, serve_command

    def command(moe_layers):
        request = CaptureRequest(workload="chat", concurrency=2, out=tmp_path / "run", model="k2-layer",
                                 moe_layers=moe_layers)
        return serve_command(request, "cpu", tmp_path / "s.json", tmp_path / "p")

    with_count = command(6)
    assert with_count[with_count.index("--moe-layers") + 1] == "6" and "--moe-layers" not in command(None)


def test_the_expert_parallel_benchmark_refuses_a_count_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/expert_parallel_captures.py", "--model", "small",
                           "--moe-layers", "3", "--ranks", "1", "--trace-dir", str(tmp_path / "traces"),
                           "--out", str(tmp_path / "out.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "" and not (tmp_path / "out.json").exists()
    assert done.stderr.count("\n") == 1 and "preset small loads its trained weights" in done.stderr, done.stderr
