"""The ``probe`` self-test kernel (see runtime/contract/probe.py for what it proves)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.memory.smem import SmemAllocator

from runtime.contract import probe as contract

from . import ptx
from .compile import contract_pointers, cubin_of, null_stream

# How long each CTA holds its write back after its dependency wait (globaltimer nanoseconds): longer than a
# dependent grid takes to start beside it (a few microseconds), so that a dependent read the wait did not order
# would land before the write.
HOLD_NS = 20_000


class ClusterProbe:
    """Each CTA sends one word to the next CTA of its cluster through DSMEM and adds it (and the seed) to its word
    of ``out``, which the previous grid wrote."""

    def __init__(self, cluster: int, threads: int, smem_bytes: int):
        self.cluster = cluster
        self.threads = threads
        self.smem_bytes = smem_bytes

    @cute.jit
    def __call__(self, out: cute.Pointer, seed: Int32, stream):
        self.kernel(out, seed).launch(
            grid=[self.cluster, 1, 1],
            block=[self.threads, 1, 1],
            cluster=[self.cluster, 1, 1],
            smem=self.smem_bytes,
            stream=stream,
        )

    @cute.kernel
    def kernel(self, out: cute.Pointer, seed: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        rank = cute.arch.block_idx_in_cluster()
        smem = SmemAllocator()
        mbar = smem.allocate_array(Int64, 1, byte_alignment=8)
        word = smem.allocate_array(Int32, 4, byte_alignment=16)

        # The next grid may start at once: it then runs beside this one, and only its dependency wait keeps its
        # read of `out` behind this grid's write, which comes late (HOLD_NS) so that a read not kept there sees the
        # word from before (runtime/probe.py checks which one it saw).
        cute.arch.griddepcontrol_launch_dependents()
        if tidx == 0:
            cute.arch.mbarrier_init(mbar, 1)
            cute.arch.mbarrier_init_fence()
        # Every CTA's barrier must be initialised before any peer stores into it.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        if tidx == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(mbar, 4)
            peer = (rank + 1) % self.cluster
            cute.arch.store_async_dsmem(word, Int32(1000) * (rank + 1) + bidx, mbar, peer)
        # The word from our predecessor has landed once the barrier's phase 0 completes.
        cute.arch.mbarrier_wait(mbar, 0)

        # Only `out` depends on the previous grid (programmatic dependent launch): it holds that grid's words.
        cute.arch.griddepcontrol_wait()
        if tidx == 0:
            received = cute.make_tensor(word, cute.make_layout(4))
            result = cute.make_tensor(out, cute.make_layout(bidx + 1))
            previous = result[bidx]
            start = ptx.globaltimer_lo()
            while ptx.globaltimer_lo() - start < Int32(HOLD_NS):
                pass
            result[bidx] = received[0] + seed + previous
        # No CTA leaves while a peer may still touch its shared memory.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()


def compile_variant(variant, arch: str) -> bytes:
    probe = ClusterProbe(variant.option("cluster"), variant.threads, variant.smem_bytes)
    return cubin_of(probe, *contract_pointers(contract, {"out": Int32}), Int32(0), null_stream(), arch=arch)
