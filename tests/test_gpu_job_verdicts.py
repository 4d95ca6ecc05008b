"""The GPU jobs' sanitizer verdicts, on the CPU: gpu/jobs/topk_sanitize_full.sh and gpu/tools/mla_sanitize.sh run
against a fake compute-sanitizer that prints crafted reports and exits with crafted codes, and
gpu/jobs/mla_support_sanitize.py with its launches stubbed. A verdict may call a run clean only where it finished
with its summary at 0 errors and its own count of what ran."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

# FAKE_<shard or tool>: clean (the run's count and its summary at 0 errors; racecheck exits 3 on its warnings, as
# --error-exitcode makes it), crash (the same, then a crash: 139), nonfinite (an MLA launch's output not finite: the
# script's count says so and it exits 1), hang (past the timeout; the summary printed on SIGTERM), empty (a shard
# given no case, as one past the case count is: "0/0", a clean summary, rc 0).
FAKE = r"""#!/usr/bin/env bash
tool=$2
key=$(printf '%s\n' "$@" | sed -n 's/^--shard=\([0-9]*\)\/.*/\1/p'); [ -n "$key" ] || key=$tool
mode=$(eval echo "\${FAKE_$key:-clean}")
summary() {
  if [ "$tool" = racecheck ]; then echo "========= RACECHECK SUMMARY: 4 hazards displayed (0 errors, 9 warnings)"
  else echo "========= ERROR SUMMARY: 0 errors"; fi
}
echo "========= COMPUTE-SANITIZER"
if [ "$FAKE_JOB" = topk ]; then echo "case ok: decode_topk randn width 40003 k=512"; count="6/6 cases match"
else
  [ "$mode" = nonfinite ] && echo "width 128 sinks True: T=5 finite=False"
  for i in 1 2 3 4 5 6 7 8; do echo "edge width 640 sinks False pools (0, 20000): finite=True"; done
  count="16/16 launches finite"; [ "$mode" = nonfinite ] && count="15/16 launches finite"
fi
[ "$mode" = empty ] && count="0/0 ${count#* }"
case $mode in
  clean|empty) echo "$count"; summary; [ "$tool" = racecheck ] && exit 3; exit 0;;
  crash) echo "$count"; echo "========= Error: process didn't terminate successfully"; summary; exit 139;;
  nonfinite) echo "$count"; echo "========= Target application returned an error"; summary; exit 1;;
  hang) trap 'summary; exit 143' TERM; sleep 60 & wait;;
esac
"""


@pytest.fixture
def fake_sanitizer(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()

    def run(script: str, *args: str, **env: str) -> str:
        full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JOB_OUT": str(out),
                    "COMPUTE_SANITIZER": str(fake), "PYTHONPATH": str(ROOT), **env}
        proc = subprocess.run(["bash", script, *args], check=False, cwd=ROOT, env=full_env, capture_output=True,
                              text=True, timeout=60)
        return proc.stdout + proc.stderr

    return run


def _verdicts(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("verdict:")]


def test_a_topk_shard_that_crashed_after_its_cases_is_not_clean(fake_sanitizer):
    """Its cases matched and its summary said 0 errors, but it exited 139: counted clean before."""
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="memcheck", SHARDS="3", SECONDS_EACH="2",
                            FAKE_JOB="topk", FAKE_1="crash", FAKE_2="hang")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 1 of 3 shards clean"), output
    assert "incomplete: 1 cases ran" in output


def test_a_topk_shard_that_ran_no_case_is_not_clean(fake_sanitizer):
    """More shards than cases leaves a shard nothing to run: its "0/0 cases match" and clean summary counted clean."""
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="memcheck", SHARDS="2", SECONDS_EACH="5",
                            FAKE_JOB="topk", FAKE_1="empty")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 1 of 2 shards clean"), output


def test_a_clean_racecheck_shard_may_exit_3_on_its_warnings(fake_sanitizer):
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="racecheck", SHARDS="2", SECONDS_EACH="5",
                            FAKE_JOB="topk")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 2 of 2 shards clean") and "crowded cases: skip" in verdict, output


@pytest.mark.parametrize("mode", ["nonfinite", "hang", "crash"])
def test_the_mla_sanitizers_verdict_reads_each_report_whole(fake_sanitizer, mode):
    """A launch's non-finite output in a report's first lines, a tool cut short by its timeout (the summary printed on
    SIGTERM), a crash after the count: the tails printed before showed 0 errors and nothing else; no verdict was
    printed."""
    output = fake_sanitizer("gpu/tools/mla_sanitize.sh", "2", FAKE_memcheck=mode)
    assert _verdicts(output) == ["verdict: 2 of 3 tools clean (0 sanitizer errors, every launch finite)"], output
    clean = fake_sanitizer("gpu/tools/mla_sanitize.sh", "5")
    assert _verdicts(clean) == ["verdict: 3 of 3 tools clean (0 sanitizer errors, every launch finite)"], clean


def test_the_mla_sanitizer_script_counts_its_launches_and_fails_on_a_non_finite_one(monkeypatch, capsys):
    """gpu/jobs/mla_support_sanitize.py printed finite=False for a launch and exited 0, so no sanitizer's summary or
    exit code said so. Its launches stubbed: the first one's output holds a NaN."""
    calls = []

    def decode(*args, **kwargs):
        calls.append(1)
        return torch.full((2, 3), float("nan") if len(calls) == 1 else 0.5)

    cases = types.ModuleType("tests.test_sparse_mla_gpu")
    cases.BMM1_SCALE = cases.BMM2_SCALE = 1.0
    cases.COMP_ROWS, cases.SWA_ROWS = 20000, 3000
    cases.make_case = lambda *args, **kwargs: ((), None)
    cases.make_edge_case = lambda *args, **kwargs: ((), None)
    ops = types.ModuleType("runtime.sparse_mla")
    ops.sparse_mla_decode = decode
    ops.supports_sparse_mla = lambda *args, **kwargs: True
    monkeypatch.setitem(sys.modules, "tests.test_sparse_mla_gpu", cases)
    monkeypatch.setitem(sys.modules, "runtime.sparse_mla", ops)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["mla_support_sanitize.py", "5"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "gpu" / "jobs" / "mla_support_sanitize.py"), run_name="__main__")
    assert exit_info.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(calls) == 16 and lines[0].endswith("finite=False") and lines[-1] == "15/16 launches finite"
