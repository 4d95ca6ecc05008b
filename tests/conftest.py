"""GPU tests carry the marker ``gpu`` and skip cleanly where no CUDA device is present."""

import os

import pytest

# Set on a GPU machine (gpu/jobs): a GPU test that would skip (no CUDA device seen, DeepGEMM missing) fails instead.
REQUIRE_GPU = os.environ.get("SPARSE_DECODE_AOT_REQUIRE_GPU", "") not in ("", "0")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    if REQUIRE_GPU:
        raise pytest.UsageError("SPARSE_DECODE_AOT_REQUIRE_GPU is set but torch sees no CUDA device")
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fp32_matmul_precision():
    """torch.set_float32_matmul_precision for a test ("highest", "high": TF32, "medium"): the process-wide setting is
    restored afterwards."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved[1])
    torch.backends.cuda.matmul.allow_tf32 = saved[0]
