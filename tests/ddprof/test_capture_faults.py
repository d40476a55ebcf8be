"""`ddprof capture` under faults, with the real nsys and the tiny model: SIGTERM and SIGINT in its
phases and nsys killed with -9. Afterwards no process of the capture is alive, no file (hidden,
partial or whole) is left in the output folder or in TMPDIR, the command said so in one line, and
the next capture works."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddprof.capture import EXPORTING, LOADING, SERVING, STARTING
from ddprof.process_group import OWNER_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
PHASE_WAIT_S = 120


def _start(tmp_path: Path, requests: int) -> subprocess.Popen:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.Popen([sys.executable, "-m", "ddprof", "capture", "--workload", "chat", "--concurrency", "4",
                             "--model", "tiny", "--requests", str(requests), "--max-new-tokens", "16",
                             "--out", str(tmp_path / "out" / "run")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(capture: subprocess.Popen, phase: str) -> list[str]:
    """Read the capture's progress lines (stderr) up to the first naming `phase`."""
    lines = []
    deadline = time.monotonic() + PHASE_WAIT_S
    while time.monotonic() < deadline:
        line = capture.stderr.readline()
        if not line:
            break
        lines.append(line)
        if f"capture: {phase}" in line:
            return lines
    pytest.fail(f"the capture never reached {phase!r}: {''.join(lines)}")


def _owned_by(pid: int) -> list[int]:
    """Live processes carrying the owner mark of ddprof process `pid`."""
    mark = f"{OWNER_VARIABLE}=ddprof-{pid}-".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(entry.startswith(mark) for entry in proc.joinpath("environ").read_bytes().split(b"\0")):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _left_behind(tmp_path: Path) -> list[Path]:
    return sorted(p for folder in (tmp_path / "out", tmp_path / "tmp") if folder.exists() for p in folder.iterdir())


def _assert_clean_stop(capture: subprocess.Popen, tmp_path: Path, returncode: int, said: str) -> None:
    _, rest = capture.communicate(timeout=120)
    errors = [line for line in rest.splitlines() if line.startswith("ddprof: error:")]
    assert capture.returncode == returncode and len(errors) == 1 and said in errors[0], rest
    assert _owned_by(capture.pid) == []
    assert _left_behind(tmp_path) == []


@pytest.mark.parametrize("signum, phase, requests", [
    (signal.SIGTERM, STARTING, 3),
    (signal.SIGINT, SERVING, 400),
    (signal.SIGTERM, EXPORTING, 3),
])
def test_a_signal_in_any_phase_stops_everything_and_leaves_nothing(signum, phase, requests, tmp_path):
    capture = _start(tmp_path, requests)
    _wait_for(capture, phase)
    capture.send_signal(signum)
    _assert_clean_stop(capture, tmp_path, 128 + signum, f"interrupted by {signal.Signals(signum).name}")


def test_nsys_killed_mid_capture_is_one_line_and_the_next_capture_works(tmp_path):
    capture = _start(tmp_path, 3)
    _wait_for(capture, LOADING)
    nsys = [pid for pid in _owned_by(capture.pid)
            if Path(f"/proc/{pid}/comm").read_text().strip() == "nsys"
            and b"profile" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    assert nsys, "no nsys profile process found"
    os.kill(nsys[0], signal.SIGKILL)
    _assert_clean_stop(capture, tmp_path, 2, "nsys profile was killed by SIGKILL")

    after = _start(tmp_path, 3)
    out, err = after.communicate(timeout=300)
    assert after.returncode == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["run.json", "run.nsys-rep", "run.sqlite"]
    assert list((tmp_path / "tmp").iterdir()) == []
