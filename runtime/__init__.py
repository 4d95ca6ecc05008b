"""Serve-time side of the AOT kernel cache: load, validate and launch precompiled cubins.

Imports torch and cuda-python only (never CuTe DSL or ``kernels/``).
"""

from .errors import CacheError, CacheLoadInterrupted
from .loader import Kernel, KernelCache, load

__all__ = ["CacheError", "CacheLoadInterrupted", "Kernel", "KernelCache", "load"]
