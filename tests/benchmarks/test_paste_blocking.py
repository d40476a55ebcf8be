"""benchmarks/paste_blocking.py: a tuning run's picks written into BLOCKING_BY_M, as its printed lines."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.batch_invariant_matmul import ranges_line
from benchmarks.blocking_goal import blocking_tunings
from benchmarks.paste_blocking import KERNEL, paste
from triton_kernels.batch_invariant_matmul import BLOCKING_BY_M, Blocking, Tiles

ROOT = Path(__file__).resolve().parents[2]
RESULTS = blocking_tunings()


def run(*args):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paste_blocking.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_the_committed_runs_paste_back_as_the_kernel_file_is(tmp_path):
    """Every committed run, earliest first: the kernel file as committed (the table is their picks)."""
    copy = tmp_path / "kernel.py"
    copy.write_text(KERNEL.read_text())
    done = run(*RESULTS, "--kernel", copy)
    assert done.returncode == 0, done.stderr
    assert copy.read_text() == KERNEL.read_text()


def test_a_pick_replaces_its_shapes_blocking_line_only(tmp_path):
    shape = (7168, 8192)
    ranges = ((64, Blocking(32, 64, 4, 6, tma=True, swap_ab=True)), (4096, Blocking(128, 256, 8, 4, tma=True, gluon=True)))
    result = {"blocking_tuned": {"7168x8192": {"ranges": [{"up_to_m": bound, "blocking": b._asdict()} for bound, b in ranges]}}}
    pasted = paste(KERNEL.read_text(), {shape: ranges})
    changed = [(a, b) for a, b in zip(KERNEL.read_text().split("\n"), pasted.split("\n")) if a != b]
    assert changed == [(changed[0][0], f"    {shape}: {ranges_line(ranges)},  # o_proj")]
    assert BLOCKING_BY_M[shape] != ranges
    path, copy = tmp_path / "run.json", tmp_path / "kernel.py"
    path.write_text(json.dumps(result))
    copy.write_text(KERNEL.read_text())
    assert run(path, "--kernel", copy).returncode == 0
    assert copy.read_text() == pasted


def test_a_split_runs_tiling_replaces_its_shapes_tuned_line_comment_in_place(tmp_path):
    """A --tune-split run's "split_tuned" pick: the shape's TUNED line takes its Tiles, its comment
    in the same column; its BLOCKING_BY_M line takes the run's blocking picks."""
    shape, tiles = (7168, 8192), Tiles(64, 128, 64, 4, 4, split_k=2)
    ranges = ((4096, Blocking(64, 64, 4, 6, tma=True, stream_k=True)),)
    result = {"split_tuned": {"7168x8192": {"name": "o_proj", "dtype": "bfloat16", "tiles": tiles._asdict()}},
              "blocking_tuned": {"7168x8192": {"ranges": [{"up_to_m": b, "blocking": k._asdict()} for b, k in ranges]}}}
    path, copy = tmp_path / "run.json", tmp_path / "kernel.py"
    path.write_text(json.dumps(result))
    copy.write_text(KERNEL.read_text())
    done = run(path, "--kernel", copy)
    assert done.returncode == 0 and "1 tilings re-picked" in done.stdout, done.stderr
    changed = [(a, b) for a, b in zip(KERNEL.read_text().split("\n"), copy.read_text().split("\n")) if a != b]
    assert [b for _, b in changed] == [f"    {shape}: Tiles(64, 128, 64, 4, 4, split_k=2),   # o_proj",
                                       f"    {shape}: {ranges_line(ranges)},  # o_proj"]
    assert changed[0][0].index("# o_proj") == changed[0][1].index("# o_proj")


def test_bad_input_gets_one_line_and_leaves_the_file_alone(tmp_path):
    copy = tmp_path / "kernel.py"
    copy.write_text(KERNEL.read_text())
    broken, empty, unknown = tmp_path / "broken.json", tmp_path / "empty.json", tmp_path / "unknown.json"
    broken.write_text("{")
    empty.write_text(json.dumps({"rows": []}))
    picks = {"5x5": {"ranges": [{"up_to_m": 1, "blocking": Blocking(16, 32, 4, 4)._asdict()}]}}
    unknown.write_text(json.dumps({"blocking_tuned": picks}))
    unknown_split = tmp_path / "unknown_split.json"
    unknown_split.write_text(json.dumps({"blocking_tuned": picks, "split_tuned": {"5x5": {"tiles": Tiles(16, 32, 32, 4, 4)._asdict()}}}))
    for path, problem in ((broken, "Expecting"), (empty, "no blocking picks"), (unknown, "0 BLOCKING_BY_M lines for (5, 5)"),
                          (unknown_split, "0 TUNED lines for (5, 5)"), (tmp_path / "missing.json", "No such file")):
        done = run(RESULTS[-1], path, "--kernel", copy)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"benchmarks/paste_blocking.py: {path}: ") and problem in done.stderr, done.stderr
        assert copy.read_text() == KERNEL.read_text()
