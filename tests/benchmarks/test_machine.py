"""Every result file says which code produced it (`machine.commit`)."""

import subprocess

from benchmarks.machine import describe, source_commit


def git(root, *args):
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_is_head_with_a_mark_for_changed_files(tmp_path, monkeypatch):
    monkeypatch.delenv("DDPROF_COMMIT", raising=False)
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    assert source_commit(tmp_path) == head
    (tmp_path / "b.py").write_text("")  # untracked: not a change to the code that ran
    assert source_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == head + "+changes"
    monkeypatch.setenv("DDPROF_COMMIT", "0123abc")  # the device's copy: its git directory is stale
    assert source_commit(tmp_path) == "0123abc"


def test_a_tree_without_its_own_git_directory_names_no_commit_but_the_variable(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")  # an enclosing checkout is not the tree's commit
    inner = tmp_path / "copy"
    inner.mkdir()
    monkeypatch.delenv("DDPROF_COMMIT", raising=False)
    assert source_commit(inner) is None
    monkeypatch.setenv("DDPROF_COMMIT", "0123abc")
    assert source_commit(inner) == "0123abc"
    assert describe()["commit"] == source_commit()
