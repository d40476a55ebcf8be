"""`python -m engine` on bad input: one line on stderr naming the value or file, exit code 2, no
traceback, and nothing run (the checks come before any model is loaded or trained)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "engine" / "assets" / "tiny"
GENERATE = ["generate", "--model", "tiny", "--max-new-tokens", "4", "--prompt", "Hi", "--json"]
SERVE = ["serve", "--workload", "chat", "--model", "tiny", "--requests", "2", "--max-new-tokens", "4"]


def engine(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "engine", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {}),  # cwd's engine first, then the caller's path
                                        "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])},
                          timeout=300)


def assert_one_line(done, *fragments):
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("engine: error: ") and "Traceback" not in done.stderr, done.stderr
    for fragment in fragments:
        assert str(fragment) in lines[0]


def checkpoint(folder: Path, files: dict[str, bytes] | None = None, *, nan: bool = False) -> Path:
    """A copy of the trained tiny target, with some of its files replaced or its first weight all NaN."""
    shutil.copytree(TINY / "target", folder)
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    if nan:
        tensors = load_file(folder / "model.safetensors")
        first = sorted(tensors)[0]
        tensors[first] = torch.full_like(tensors[first], float("nan"))
        save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("args, fragments", [
    (GENERATE + ["--device", "bogus"], ["unknown device 'bogus'"]),
    (GENERATE + ["--temperature", "inf"], ["--temperature", "inf"]),
    (GENERATE + ["--temperature", "1e-310"], ["--temperature", ">= 1e-06"]),
    (SERVE + ["--budget", "2000", "--check"], ["longest request of workload chat needs", "budget 2000"]),
    (GENERATE + ["--weights", TINY / "target", "--random-weights"], ["--weights and --random-weights"]),
    (GENERATE + ["--drafter", ROOT / "engine" / "assets" / "small" / "drafter.safetensors"],
     ["small/drafter.safetensors: a drafter for another target"]),
    (GENERATE + ["--drafter", ROOT / "no-such-drafter.safetensors"], ["no-such-drafter.safetensors"]),
    (GENERATE + ["--mode", "ar", "--builder", "gpu"], ["--builder: only for --mode ddtree"]),
    (GENERATE + ["--mode", "ar", "--budget", "16"], ["--budget: only for --mode ddtree"]),
    (SERVE + ["--cpu-threads", "100000"], ["--cpu-threads"]),
    (SERVE + ["--summary", ROOT / "no-such-folder" / "s.json"], ["--summary", "does not exist"]),
    (SERVE + ["--progress", ROOT], ["--progress", "is a folder"]),
    (["train-drafter", "--model", "tiny", "--steps", "1", "--held-out-prompts", "0"], ["--held-out-prompts"]),
    (["train-target", "--model", "tiny", "--steps", "1", "--lr", "nan"], ["--lr"]),
    (["train-target", "--model", "tiny", "--steps", "1", "--threads", "100000"], ["--threads must be between 1 and"]),
])
def test_bad_values_are_one_line(args, fragments):
    assert_one_line(engine(*args), *fragments)


def test_a_budget_the_gpu_builder_cannot_build_is_refused_by_serve_check_too():
    for command in (GENERATE, SERVE + ["--check"]):
        done = engine(*command, "--builder", "gpu", "--budget", "60", env={"TRITON_INTERPRET": "1"})
        assert_one_line(done, "--builder gpu: budget 60")


@pytest.mark.parametrize("files, nan, fragment", [
    ({"model.safetensors": b"not safetensors"}, False, "model.safetensors: not a readable safetensors file"),
    ({"config.json": b"\xff\xfe{}"}, False, "config.json: not valid JSON"),
    # Absent fields take DeepSeek-V3's values (61 layers, the first 3 dense), which these files do not hold.
    ({"config.json": b'{"hidden_size": 64}'}, False, "unexpected tensor model.layers.1.mlp.experts"),
    ({"config.json": b'{"hidden_act": "gelu"}'}, False, "config.json: hidden_act 'gelu' is not supported"),
    (None, True, "holds NaN or Inf"),
])
def test_a_spoilt_checkpoint_is_one_line_naming_its_file(tmp_path, files, nan, fragment):
    folder = checkpoint(tmp_path / "target", files, nan=nan)
    assert_one_line(engine(*GENERATE, "--weights", folder), folder, fragment)


def test_config_values_of_the_wrong_type_or_sign_are_named(tmp_path):
    config = (TINY / "target" / "config.json").read_text()
    for bad, field in ((config.replace('"num_hidden_layers": 2', '"num_hidden_layers": -1'), "num_hidden_layers"),
                       (config.replace('"hidden_size": 64', '"hidden_size": "64"'), "hidden_size")):
        assert bad != config
        folder = checkpoint(tmp_path / field, {"config.json": bad.encode()})
        assert_one_line(engine(*GENERATE, "--weights", folder), f"{field} must be a non-negative int")


def test_an_incomplete_trained_pair_is_refused_not_replaced_by_random_weights(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "engine", clone / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "engine" / "assets" / "tiny" / "drafter.safetensors").unlink()
    assert_one_line(engine(*SERVE, cwd=clone), "preset tiny: the trained pair", "lacks its drafter")


def test_a_corrupt_tokenizer_is_one_line_too(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "engine", clone / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "engine" / "assets" / "tokenizer.json").write_text('{"merges": [1, 2')
    assert_one_line(engine(*SERVE, cwd=clone), "tokenizer.json")


def test_a_prompt_that_is_not_utf8_is_tokenised_as_its_bytes():
    done = subprocess.run([sys.executable, "-m", "engine", *GENERATE[:-3], "--json", "--prompt", "\udcff\udcfe"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr


def test_serve_sizes_its_cache_by_the_requests_not_a_huge_concurrency(tmp_path):
    done = engine(*SERVE, "--concurrency", "10000000", "--summary", tmp_path / "s.json")
    assert done.returncode == 0, done.stderr


def test_an_output_file_another_rank_checked_at_the_same_time_is_no_error(tmp_path, monkeypatch):
    """Each rank of `serve --ranks N` probes --progress and --summary as it starts (create the file,
    remove it if it was not there): another rank may remove it first. That is no error (it was a
    traceback, 1 run in 10 of test_serve_ranks.py)."""
    import builtins

    from engine import arguments

    path, real_open = tmp_path / "progress", builtins.open
    # engine.arguments' own `open`, so nothing else in the process sees the wrapper

    def probe_then_the_other_rank_unlinks(file, *args, **kwargs):
        handle = real_open(file, *args, **kwargs)
        Path(file).unlink()
        return handle

    monkeypatch.setattr(arguments, "open", probe_then_the_other_rank_unlinks, raising=False)
    arguments.output_file(path, "--progress")
    assert not path.exists()
