"""The GPU jobs' sanitizer verdicts, on the CPU: gpu/jobs/topk_sanitize_full.sh and gpu/tools/mla_sanitize.sh run
against a fake compute-sanitizer that prints crafted reports and exits with crafted codes, and
gpu/jobs/mla_support_sanitize.py with its launches stubbed. A verdict may call a run clean only where it finished
with its summary at 0 errors and its own count of what ran."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

# FAKE_<shard or tool>: clean (the run's count and its summary at 0 errors; racecheck exits 3 on its warnings, as
# --error-exitcode makes it), crash (the same, then a crash: 139), nonfinite (an MLA launch's output not finite: the
# script's count says so and it exits 1), hang (past the timeout; the summary printed on SIGTERM).
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
case $mode in
  clean) echo "$count"; summary; [ "$tool" = racecheck ] && exit 3; exit 0;;
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


def test_a_clean_racecheck_shard_may_exit_3_on_its_warnings(fake_sanitizer):
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="racecheck", SHARDS="2", SECONDS_EACH="5",
                            FAKE_JOB="topk")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 2 of 2 shards clean") and "crowded cases: skip" in verdict, output
