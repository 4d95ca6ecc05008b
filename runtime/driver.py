"""The few CUDA driver calls the runtime makes, with errors turned into exceptions."""

from __future__ import annotations

import functools

from .errors import NoDriverError

_driver = None


def driver():
    """cuda.bindings.driver, initialised; NoDriverError where there is none (CI)."""
    global _driver
    if _driver is None:
        try:
            import cuda.bindings.driver as drv
        except ImportError as e:  # pragma: no cover - depends on the install
            raise NoDriverError(f"cuda-python is not importable ({e}).", fix="pip install cuda-python") from None
        try:
            (err,) = drv.cuInit(0)
        except RuntimeError as e:  # libcuda.so.1 absent
            raise NoDriverError(
                f"no CUDA driver on this machine ({e}).",
                fix="run on a machine with an NVIDIA GPU and driver; CPU-only machines can use the torch fallbacks",
            ) from None
        if err != drv.CUresult.CUDA_SUCCESS:
            raise NoDriverError(
                f"the CUDA driver cannot initialise ({err.name}): no GPU or no driver on this machine.",
                fix="run on a machine with an NVIDIA GPU and driver; CPU-only machines can use the torch fallbacks",
            )
        _driver = drv
    return _driver


class CudaCallError(RuntimeError):
    """A driver call returned an error; ``result`` is its CUresult."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class _NeverRaised(Exception):
    pass


@functools.cache
def missing_function_error() -> type:
    """What cuda-bindings raises where the installed driver lacks a function it wraps (e.g. cuFuncGetParamInfo
    before 12.4): FunctionNotFoundError, a RuntimeError, in cuda-bindings 13. Where it moves, a class nothing
    raises, so that no other error passes for it."""
    try:
        from cuda.bindings._internal.utils import FunctionNotFoundError
    except ImportError:  # pragma: no cover - depends on the install
        return _NeverRaised
    return FunctionNotFoundError


def check(result, call: str):
    """Unpack a cuda-python result tuple, raising on any error (CUDA_SUCCESS is 0: one test on success)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err:
        drv = driver()
        _, text = drv.cuGetErrorString(err)
        raise CudaCallError(f"{call} failed: {err.name} ({text.decode() if text else ''})", err)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)
