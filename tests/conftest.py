"""GPU tests carry the marker ``gpu`` and skip cleanly where no CUDA device is present."""

import os

import pytest

# Set on a GPU machine (gpu/jobs): a GPU test that would skip (no CUDA device seen, DeepGEMM or triton missing, any
# other skip of a test marked gpu) fails instead.
REQUIRE_GPU = os.environ.get("SPARSE_DECODE_AOT_REQUIRE_GPU", "") not in ("", "0")


# The seeded random sweeps (test_random_calls_match_the_reference in test_topk_gpu.py and test_sparse_mla_gpu.py) draw
# this many calls (sparse MLA a quarter as many: each of its calls is a batch of tokens); a soak raises it.
FUZZ_CASES_ENV = "SPARSE_DECODE_AOT_FUZZ_CASES"


def _fuzz_cases() -> int:
    raw = os.environ.get(FUZZ_CASES_ENV, "60")
    try:
        cases = int(raw)
    except ValueError:
        cases = 0
    if cases < 1:
        raise pytest.UsageError(f"{FUZZ_CASES_ENV}={raw!r}: set a whole number of random calls, at least 1 "
                                f"(default 60)")
    return cases


def pytest_configure(config):
    _fuzz_cases()  # said once, before any test runs, not as a ValueError in every sweep
    _warm_cpu_exp()


def _warm_cpu_exp() -> None:
    """One CPU torch.exp before any test: a process's first exp over a large tensor sometimes splits it unlike every
    later call (about 1 process in 60-100 on the 2-core CI machine, none with OMP_NUM_THREADS=1), and a vectorized
    chunk's last ulp moved; a test comparing the op's fallback with a second reference run, bit for bit, then failed
    when its call was the process's first exp (a -k run). 100 fresh processes after this warm-up: none."""
    try:
        import torch
    except ImportError:
        return
    torch.exp(torch.zeros(1 << 16))


@pytest.fixture
def fuzz_cases() -> int:
    """How many random calls a sweep draws: SPARSE_DECODE_AOT_FUZZ_CASES, default 60."""
    return _fuzz_cases()


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _is_gpu_test(item) -> bool:
    """Whether ``item`` carries the gpu marker, as `-m gpu` selects (item.keywords also hold its name and its
    parameters' ids: a parameter id "gpu" is no marker)."""
    return item.get_closest_marker("gpu") is not None


def _unmarked_gpu_module_tests(items) -> list[str]:
    """Tests in a tests/*_gpu.py module without the gpu marker: the GPU jobs select `-m gpu`, so such a test would
    run on no GPU pass and go missing from its count, while CI would run it without a device."""
    return [item.nodeid for item in items if item.path.name.endswith("_gpu.py") and not _is_gpu_test(item)]


def pytest_collection_modifyitems(config, items):
    unmarked = _unmarked_gpu_module_tests(items)
    if unmarked:
        raise pytest.UsageError(f"tests in GPU modules without the gpu marker: {', '.join(unmarked[:5])}; mark them "
                                f"(pytestmark = pytest.mark.gpu) or move them to a CPU test module")
    if _cuda_available():
        return
    if REQUIRE_GPU:
        raise pytest.UsageError("SPARSE_DECODE_AOT_REQUIRE_GPU is set but torch sees no CUDA device")
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if _is_gpu_test(item):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With SPARSE_DECODE_AOT_REQUIRE_GPU set, a GPU test that skips from inside (pytest.skip, pytest.importorskip: a
    dependency missing on the GPU machine, such as triton for the sparse-MLA peer) fails instead. The collection check
    above sees only whether torch has a device, and _deepgemm in test_indexer_gpu.py covers DeepGEMM alone."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and _is_gpu_test(item) and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"SPARSE_DECODE_AOT_REQUIRE_GPU is set but this GPU test skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """With SPARSE_DECODE_AOT_REQUIRE_GPU set, a GPU test module (tests/*_gpu.py) that skips as a whole when collected
    (a module-level pytest.importorskip or pytest.skip(allow_module_level=True)) fails instead: the hook above sees
    only the tests' own runs, so such a module's tests all went uncounted as one "skipped" line, exit status 0. Other
    modules' skips stay (test_build.py's, without CuTe DSL on the GPU machine)."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and isinstance(collector, pytest.Module) and collector.path.name.endswith(
            "_gpu.py"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"SPARSE_DECODE_AOT_REQUIRE_GPU is set but this GPU test module skipped: {reason}"


@pytest.fixture
def fp32_matmul_precision():
    """torch.set_float32_matmul_precision for a test ("highest", "high": TF32, "medium"): the process-wide setting is
    restored afterwards."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved[1])
    torch.backends.cuda.matmul.allow_tf32 = saved[0]
