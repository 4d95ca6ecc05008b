"""The committed result records (benchmarks/results): each one parses, and each one says what it ran on, either
itself (a "commit" key, as benchmarks.common's gpu_info and tree_info write it) or through provenance.json, which
names the commit that added each older record and, where known, the tree it ran on (CPU)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PROVENANCE = RESULTS / "provenance.json"
FULL_HASH = re.compile(r"[0-9a-f]{40}")


def _records() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.suffix in (".json", ".jsonl") and p != PROVENANCE)


def _load(path: Path):
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


COMMIT_HASH = re.compile(r"\b[0-9a-f]{7,40}\b")


def _names_a_commit(value, depth: int = 0) -> bool:
    """Whether a key naming a commit ("commit", "tree_commit", ...) holds a commit hash within the first five levels
    (a JSONL file: any of its lines). The key alone is not enough: "committed" keys hold the committed cubins'
    timings, and two early records say only "HEAD"."""
    if depth > 4:
        return False
    if isinstance(value, dict):
        return any(("commit" in key.lower() and isinstance(v, str) and COMMIT_HASH.search(v))
                   or _names_a_commit(v, depth + 1) for key, v in value.items())
    if isinstance(value, list):
        return any(_names_a_commit(v, depth + 1) for v in value)
    return False


def _provenance() -> dict:
    return json.loads(PROVENANCE.read_text(encoding="utf-8"))["files"]


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def _full_history() -> bool:
    out = _git("rev-parse", "--is-shallow-repository")
    return out is not None and out.returncode == 0 and out.stdout.strip() == "false"


def test_every_record_parses():
    bad = []
    for path in _records():
        try:
            _load(path)
        except (ValueError, UnicodeDecodeError) as exc:
            bad.append(f"{path.name}: {exc}")
    assert not bad, bad
    assert len(_records()) > 100  # the folder was read, not an empty glob


def test_every_record_names_its_commit_or_is_in_the_provenance_index():
    listed = _provenance()
    missing = [p.name for p in _records() if not _names_a_commit(_load(p)) and p.name not in listed]
    assert not missing, (f"{missing}: record the commit (benchmarks.common.gpu_info / tree_info under an \"info\" "
                         "key) or add the file to benchmarks/results/provenance.json")


def test_the_provenance_index_lists_only_existing_records_that_lack_a_commit():
    for name in _provenance():
        path = RESULTS / name
        assert path.is_file(), f"provenance.json lists {name}, which is not in benchmarks/results"
        assert not _names_a_commit(_load(path)), f"{name} names its commit itself: drop it from provenance.json"


def test_the_provenance_index_names_full_commits():
    for name, entry in _provenance().items():
        assert FULL_HASH.fullmatch(entry["recorded_in"]), name
        assert entry["run_on"] is None or FULL_HASH.fullmatch(entry["run_on"]), name
        assert (entry["run_on"] is None) == (entry["run_on_from"] is None), name
        assert entry["machine"] in ("NVIDIA H200", "CPU build machine"), name


@pytest.mark.skipif(not _full_history(), reason="needs git and the repository's full history")
def test_the_provenance_index_matches_the_history():
    """recorded_in is the commit that added the file; run_on is a commit that came before it."""
    for name, entry in _provenance().items():
        added = _git("log", "--diff-filter=A", "--format=%H", "--", f"benchmarks/results/{name}").stdout.split()
        assert added and added[-1] == entry["recorded_in"], (name, added)
        if entry["run_on"]:
            ancestor = _git("merge-base", "--is-ancestor", entry["run_on"], entry["recorded_in"])
            assert ancestor.returncode == 0, f"{name}: run_on {entry['run_on']} is not before {entry['recorded_in']}"
