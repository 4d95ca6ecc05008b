"""A result's ``source_sha256`` names the host code it ran, even where the GPU machine's copy of
the checkout carries stale git metadata (its ``commit`` field then names an older HEAD)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.common import (
    SOURCE_FOLDERS,
    files_differ_from_head,
    head_commit,
    source_digest,
    source_digest_of_commit,
    tree_info,
)

ROOT = Path(__file__).resolve().parent.parent


def test_digest_names_paths_and_bytes():
    base = [("runtime/a.py", b"x = 1\n"), ("runtime/b.py", b"")]
    assert source_digest(lambda: base) == source_digest(lambda: list(base))
    assert source_digest(lambda: base) != source_digest(lambda: [("runtime/a.py", b"x = 2\n"), base[1]])
    assert source_digest(lambda: base) != source_digest(lambda: [("runtime/c.py", b"x = 1\n"), base[1]])
    # Length-prefixed: moving bytes between files changes the digest.
    assert source_digest(lambda: [("a", b"xy"), ("b", b"")]) != source_digest(lambda: [("a", b"x"), ("b", b"y")])


def test_working_tree_digest_equals_its_commit_where_clean():
    """CI runs on a clean clone, where the working tree's digest must equal HEAD's."""
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *SOURCE_FOLDERS],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    if any(line.endswith(".py") for line in dirty.splitlines()):
        pytest.skip("host code has uncommitted changes here")
    assert source_digest() == source_digest_of_commit("HEAD")


def test_files_differ_from_head_names_a_stale_commit(tmp_path):
    """A result's ``files_differ_from_commit`` is True where the files are not its ``commit``'s."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    try:
        subprocess.run(git + ["init", "-q", str(tmp_path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git")
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "a"], cwd=tmp_path, check=True)
    assert files_differ_from_head(tmp_path) is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert files_differ_from_head(tmp_path) is True
    assert files_differ_from_head(tmp_path.parent / "no_such_folder") is None


def test_tree_info_names_the_checkout_a_cpu_record_ran():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    info = tree_info()
    if head.returncode == 0:
        assert info["commit"] == head.stdout.strip()
    assert info["source_sha256"] == source_digest()
    assert set(info) == {"commit", "files_differ_from_commit", "host", "manifest_sha256", "source_sha256"}


def test_head_commit_outside_git_takes_the_environments(tmp_path, monkeypatch):
    """A copy of the checkout without git metadata names its commit through GIT_COMMIT."""
    monkeypatch.setenv("GIT_COMMIT", "f" * 40)
    assert head_commit(tmp_path) == "f" * 40
    monkeypatch.delenv("GIT_COMMIT")
    assert head_commit(tmp_path) == ""


def test_gpu_info_describes_the_current_device(monkeypatch):
    """The benchmarks put their tensors on the current device, so the record names it, not device 0; the driver is
    the first of nvidia-smi's lines (one a GPU)."""
    from types import SimpleNamespace

    import torch

    from benchmarks import common

    names = {0: "GPU zero", 1: "GPU one"}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=names[i], multi_processor_count=100 + i, L2_cache_size=7))
    real_run = common.subprocess.run

    def run(command, *args, **kwargs):
        if command[0] == "nvidia-smi":
            return SimpleNamespace(stdout="580.1\n580.1\n")
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(common.subprocess, "run", run)
    info = common.gpu_info()
    assert (info["gpu"], info["device_index"], info["sms"], info["driver"]) == ("GPU one", 1, 101, "580.1")
