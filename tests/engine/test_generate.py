"""`python -m engine generate` end to end, and the tree-builder choice."""

import json
import os
import shutil
import subprocess
import sys

from engine.generate import generate
from engine.tokenizer import load_tokenizer
from tests.engine.gpu_builder import models_for_gpu_builder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "engine", "generate", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def generate_json(mode, budget=None, prompt="Hello, world"):
    tree = ["--builder", "cpu", "--budget", str(budget)] if budget else []
    done = cli("--model", "tiny", "--seed", "0", "--mode", mode, *tree, "--max-new-tokens", "20", "--prompt", prompt,
               "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cli_ddtree_prints_the_ar_tokens():
    ar = generate_json("ar")
    assert set(ar) >= {"tokens", "target_forwards", "accept_lengths"}
    assert len(ar["tokens"]) == 20 and ar["target_forwards"] == 20 and ar["accept_lengths"] == []
    for budget in (2, 12):
        dd = generate_json("ddtree", budget)
        assert dd["tokens"] == ar["tokens"]
        assert dd["target_forwards"] == 1 + len(dd["accept_lengths"])
        assert len(dd["tokens"]) <= 1 + sum(1 + n for n in dd["accept_lengths"])


def test_cli_gpu_builder_without_cuda_is_a_one_line_error():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = cli("--model", "tiny", "--builder", "gpu", "--device", "cpu", "--prompt", "hi", env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("engine: error: --builder gpu")


def test_gpu_builder_is_lossless_too(trained):
    """The Triton builder (on CUDA, or interpreted on the CPU) is what the step calls with builder="gpu";
    the trained pair's drafts are often right, so its trees decide how far each step gets."""
    target, drafter = models_for_gpu_builder(trained)
    tok = load_tokenizer()
    prompts = [[tok.bos_id] + tok.encode(text) for text in ("def f(x):\n    return x", "import os\nimport ")]
    ar = generate(target, drafter, prompts, mode="ar", max_new_tokens=12, nvtx=False)
    gpu = generate(target, drafter, prompts, mode="ddtree", builder="gpu", budget=6, max_new_tokens=12, nvtx=False)
    cpu = generate(target, drafter, prompts, mode="ddtree", builder="cpu", budget=6, max_new_tokens=12, nvtx=False)
    assert [r.tokens for r in gpu] == [r.tokens for r in ar]
    assert [r.accept_lengths for r in gpu] == [r.accept_lengths for r in cpu]
    assert sum(sum(r.accept_lengths) for r in gpu) > 0


def test_cli_no_batch_invariant_runs_the_vendor_gemms():
    """--no-batch-invariant decodes through plain GEMMs: the same model, numbers that may differ in
    the last bits, so its own tokens (here, on MKL, it must still run and decode 20 of them)."""
    done = cli("--model", "tiny", "--seed", "0", "--mode", "ar", "--max-new-tokens", "20", "--prompt", "Hello, world",
               "--no-batch-invariant", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["tokens"]) == 20


def test_batch_invariance_is_switched_per_process_and_training_turns_it_off():
    import engine.model as model

    assert model._batch_invariant
    with model.plain_matmuls():
        assert not model._batch_invariant
    model.set_batch_invariant(False)
    try:
        assert not model._batch_invariant
    finally:
        model.set_batch_invariant(True)


def test_cli_weights_compute_in_the_given_dtype_and_stop_at_the_checkpoints_eos(tmp_path):
    """The trained tiny target as a checkpoint: stored in bf16, so `--dtype float32` is what the preset
    computes; its config.json's eos_token_id is where decoding stops."""
    preset_tokens = generate_json("ar")["tokens"]
    checkpoint = tmp_path / "target"
    shutil.copytree(os.path.join(ROOT, "engine", "assets", "tiny", "target"), checkpoint)
    common = ["--weights", str(checkpoint), "--mode", "ar", "--max-new-tokens", "20", "--prompt", "Hello, world",
              "--json"]
    done = cli(*common, "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == preset_tokens
    stop = preset_tokens[next(i for i in range(2, 20) if preset_tokens[i] not in preset_tokens[:i])]
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "eos_token_id": stop}))
    done = cli(*common, "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == preset_tokens[:preset_tokens.index(stop) + 1]
    done = cli(*common)  # the checkpoint's own dtype, bf16
    assert done.returncode == 0, done.stderr
    assert 1 <= len(json.loads(done.stdout)["tokens"]) <= 20
