"""The ``empty`` family: a kernel that does nothing, for benchmark floors."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32

from .compile import cubin_of, null_stream


class EmptyKernel:
    def __init__(self, cluster: int, threads: int):
        self.cluster = cluster
        self.threads = threads

    @cute.jit
    def __call__(self, unused: Int32, stream):
        self.kernel(unused).launch(
            grid=[self.cluster, 1, 1], block=[self.threads, 1, 1], cluster=[self.cluster, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, unused: Int32):
        pass


def compile_variant(variant, arch: str) -> bytes:
    kernel = EmptyKernel(variant.option("cluster"), variant.threads)
    return cubin_of(kernel, Int32(0), null_stream(), arch=arch)
