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


def test_a_gpu_test_module_skipped_as_a_whole_fails_where_gpu_tests_are_required(tmp_path):
    """A module-level importorskip in a tests/*_gpu.py module skipped all its tests at collection, past the runtest
    hook that turns a GPU test's skip into a failure: with SPARSE_DECODE_AOT_REQUIRE_GPU set, pytest said "1 skipped"
    and exited 0. Now that module is a collection error; another module's skip (test_build.py's) stays a skip. Torch
    is made to see a device (a plugin) so that the run gets past the collection's no-device check."""
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA GPU\n")
    (tmp_path / "fake_device.py").write_text("import torch\n\ntorch.cuda.is_available = lambda: True\n")
    missing = "import pytest\n\npytest.importorskip('no_such_module_here')\n\n\ndef test_one():\n    pass\n"
    (tmp_path / "test_lacking_gpu.py").write_text("import pytest\n\npytestmark = pytest.mark.gpu\n" + missing)
    (tmp_path / "test_lacking_build.py").write_text(missing)

    def run(require: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "SPARSE_DECODE_AOT_REQUIRE_GPU": require, "PYTHONPATH": str(tmp_path)}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fake_device",
                               "-m", "gpu", "-rs", str(tmp_path)], capture_output=True, text=True, env=env,
                              timeout=120, check=False, cwd=tmp_path)

    required = run("1")
    assert required.returncode == pytest.ExitCode.INTERRUPTED, required.stdout + required.stderr
    assert "ERROR collecting test_lacking_gpu.py" in required.stdout, required.stdout
    assert "SPARSE_DECODE_AOT_REQUIRE_GPU is set but this GPU test module skipped" in required.stdout
    assert "SKIPPED [1] test_lacking_build.py" in required.stdout, required.stdout
    not_required = run("")
    assert not_required.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, not_required.stdout + not_required.stderr
    assert "2 skipped" in not_required.stdout, not_required.stdout


def test_an_unmarked_test_in_a_gpu_module_stops_the_collection(tmp_path):
    """The GPU jobs select `-m gpu`: a test in a tests/*_gpu.py module without the marker ran on no GPU pass, and the
    pass's count simply had one test fewer. Now the collection stops, naming it, on CI and the GPU machine alike."""
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA GPU\n")
    (tmp_path / "test_mixed_gpu.py").write_text("import pytest\n\n\n@pytest.mark.gpu\ndef test_marked():\n"
                                                "    pass\n\n\ndef test_unmarked():\n    pass\n")
    (tmp_path / "test_plain.py").write_text("def test_cpu():\n    pass\n")

    def collect() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                               str(tmp_path)], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
                              env={**os.environ, "SPARSE_DECODE_AOT_REQUIRE_GPU": ""})

    proc = collect()
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "tests in GPU modules without the gpu marker: test_mixed_gpu.py::test_unmarked;" in proc.stderr, proc.stderr
    (tmp_path / "test_mixed_gpu.py").write_text("import pytest\n\npytestmark = pytest.mark.gpu\n\n\n"
                                                "def test_marked():\n    pass\n")
    marked = collect()
    assert marked.returncode == pytest.ExitCode.OK, marked.stdout + marked.stderr


def test_a_gpu_module_test_counts_as_marked_by_its_marker_alone(tmp_path):
    """`-m gpu` selects by the marker, while item.keywords also hold the test's name and its parameters' ids: an
    unmarked test of a GPU module with a parameter id "gpu" passed the check above, and ran on no GPU pass."""
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA GPU\n")
    (tmp_path / "test_params_gpu.py").write_text("import pytest\n\n\n@pytest.mark.parametrize('where', ['gpu'])\n"
                                                 "def test_unmarked(where):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
                          env={**os.environ, "SPARSE_DECODE_AOT_REQUIRE_GPU": ""})
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "without the gpu marker: test_params_gpu.py::test_unmarked[gpu];" in proc.stderr, proc.stderr
