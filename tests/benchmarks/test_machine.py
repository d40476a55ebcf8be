"""Every result file says which code produced it (`machine.commit`)."""

import subprocess
from pathlib import Path

from benchmarks.machine import describe, source_commit

ROOT = Path(__file__).resolve().parents[2]


def test_the_commit_is_git_head_here_and_the_variable_where_there_is_no_git(monkeypatch):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    monkeypatch.delenv("DDPROF_COMMIT", raising=False)
    assert source_commit().removesuffix("+changes") == head
    assert describe()["commit"] == source_commit()
    monkeypatch.setenv("DDPROF_COMMIT", "0123abc")
    assert describe()["commit"] == "0123abc"
