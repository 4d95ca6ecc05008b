"""The suite's own settings (tests/conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FUZZ_CASES_ENV


def _collect_with_fuzz_cases(value: str) -> subprocess.CompletedProcess:
    """pytest, in a fresh process, collecting this file (no test runs) with the fuzz case count set to ``value``."""
    env = {**os.environ, FUZZ_CASES_ENV: value}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           str(Path(__file__))], capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_a_malformed_fuzz_case_count_is_one_usage_error_before_any_test(value):
    """A count that is not a whole number >= 1 was read only by the GPU sweeps' fixture: a CPU run passed, and a GPU
    run raised one ValueError a sweep (or, for 0, drew no call). pytest now stops at start-up naming the variable."""
    proc = _collect_with_fuzz_cases(value)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert f"{FUZZ_CASES_ENV}={value!r}: set a whole number of random calls, at least 1" in proc.stderr, proc.stderr


def test_a_whole_fuzz_case_count_is_taken():
    proc = _collect_with_fuzz_cases("7")
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
