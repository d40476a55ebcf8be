"""`python -m engine serve --ranks N` as real processes: it serves, refuses rank counts the experts
cannot split into, and when a rank dies or hangs mid-run the others stop with one line, no hang."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "engine", "serve", "--workload", "fixed", "--model", "tiny", "--device", "cpu"]


def serve(*args, timeout=120):
    return subprocess.run([*SERVE, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_two_ranks_serve_the_same_tokens_as_one(tmp_path):
    for ranks in (1, 2):
        done = serve("--requests", "3", "--max-new-tokens", "12", "--ranks", str(ranks),
                     "--summary", str(tmp_path / f"{ranks}.json"))
        assert done.returncode == 0, done.stderr
    one, two = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (1, 2))
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert two["generated_tokens"] == one["generated_tokens"] and two["steps"] == one["steps"]


@pytest.mark.parametrize("ranks, problem", [("16", "more ranks than the model's 8 routed experts"),
                                            ("3", "8 routed experts do not divide evenly among 3 ranks")])
def test_rank_counts_the_experts_cannot_split_into(ranks, problem):
    done = serve("--requests", "2", "--ranks", ranks)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and problem in done.stderr and "Traceback" not in done.stderr


def test_ranks_disagreeing_with_torchrun_are_refused():
    done = subprocess.run([*SERVE, "--ranks", "2", "--check"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "WORLD_SIZE": "4", "RANK": "0"}, timeout=60)
    assert done.returncode == 2 and "--ranks 2 but WORLD_SIZE is 4" in done.stderr


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("stop, blamed", [(signal.SIGKILL, "rank 1 of 2 was killed by signal SIGKILL"),
                                          (signal.SIGSTOP, "rank 1 of 2 stopped answering")])
def test_a_rank_that_dies_or_hangs_mid_run_stops_the_others(tmp_path, stop, blamed):
    """Rank 1 is killed (its peer's all-reduce fails at once) or stopped (its peer's times out)
    while serving; the survivor says which collective failed, the launcher which rank failed."""
    progress = tmp_path / "progress"
    launcher = subprocess.Popen([*SERVE, "--requests", "64", "--max-new-tokens", "64", "--ranks", "2",
                                 "--rank-timeout", "4", "--progress", str(progress)],
                                cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not (progress.exists() and progress.read_text().splitlines()[-1:] != ["loading"]):
        assert launcher.poll() is None, f"the ranks ended before serving: {launcher.stderr.read()}"
        assert time.monotonic() < deadline, "the ranks never started serving"
        time.sleep(0.1)
    rank_1 = children(launcher.pid)[1]
    os.kill(rank_1, stop)
    started = time.monotonic()
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 2
    assert time.monotonic() - started < 30  # the timeout is 4 s (+ the launcher's grace)
    lines = stderr.strip().splitlines()
    assert len(lines) == 2, stderr  # the survivor's line, then the launcher's
    assert lines[0].startswith("engine: error: rank 0: the MoE all-reduce with the other 1 ranks failed"), stderr
    assert lines[1].startswith(f"engine: error: {blamed}"), stderr


def test_a_rank_whose_peers_never_join_gives_up_within_its_timeout():
    from engine.ranks import rendezvous

    with rendezvous(2) as group:
        started = time.monotonic()
        done = subprocess.run([*SERVE, "--requests", "2", "--rank-timeout", "3"], cwd=REPO, capture_output=True,
                              text=True, env={**os.environ, **group, "RANK": "0"}, timeout=120)
    assert done.returncode == 2 and time.monotonic() - started < 60
    assert done.stderr.startswith("engine: error: rank 0: cannot join the 2 ranks at 127.0.0.1:")
    assert done.stderr.count("\n") == 1
