"""Sparse-MLA decode on Hopper (sm_90a): one 128-thread CTA per (token, 128-column chunk).

The math and the kernel's shape are in DESIGN.md ("sparse_mla_decode"); the
contract (parameters, variants, shared memory) in runtime/contract/sparse_mla_decode.py.

Per CTA (one warpgroup), for token t and chunk j of its n = width / 128 chunks:

  step 1  sinks, before griddepcontrol.wait (weights, not produced by the previous grid): n > 1,
          the owner's head's into a register; n = 1, each head's into shared memory, since ptxas
          placed loads held in registers for step 8 below the wait, near their use
  step 2  griddepcontrol.wait; Q copies issued; each thread loads the indices of its rows (and,
          after the gather is issued, those of its accumulator rows: the softmax's mask)
  step 3  cp.async gather of KV [128, 512] (and Q [16, 512]) into 128B-swizzled K-major tiles,
          one async group per 128-byte K block; masked rows are zero-filled without a read
  step 4  S^T = KV Q^T: FP8 WGMMA, two m64 tiles, N 16, K 512, issued per K block as it lands,
          each K block in its own accumulators (FP32 promotion every 128 products);
          n > 1: each K block's V^T fragments for the second product built after its MMAs;
          launch_dependents once they are issued
  step 5  chunk softmax per head in base 2 (bmm1_scale * log2 e folded), P^T = 256 exp2(S - m)
          as E4M3 into a 128B-swizzled K-major tile (scaled so that small weights stay normal),
          its K order permuted (_pv_k), in whole words (lanes g and g ^ 1 swap pairs: _store_p);
          n = 1: the first-half V^T fragments built after its max barrier
  step 6  (m, l) per head to every CTA of the cluster (st.async onto the receiver's mbarrier)
  step 7  O^T = V^T P^T: FP8 WGMMA with V^T from registers (see below for the route)
  step 8  while the second product runs: each head's factor. n = 1: merge (m, l) and the sink
          into the whole normalisation. n > 1: 1 / l_c, this chunk's own sum only
  step 9  n = 1: BF16 straight from the accumulators. n > 1: partial O / l_c (FP16, see below)
          -> staging in the own KV tile, the first half's tiles while the second half's MMAs
          run; block b of the 512 head dims goes by bulk copy to CTA b % n, into its KV
          tile's second quarter, as soon as the sender's staging is written and the cluster's
          stats have arrived (every KV tile is free once its CTA's stats are sent); lane 0 of
          warp k - 1 issues the k-th copy
  step 10 the owner merges the n chunks' (m, l) and the sink into a weight per chunk for its
          block's heads, adds the n partials times their weights in FP32 as they land (an
          mbarrier per receive slot), and stores BF16; a last cluster barrier, which an
          owner arrives at once its blocks are in, keeps every CTA resident until the copies
          reading its shared memory have landed

Why the owners weigh the partials (thirty-second session, sparse_mla_ab_h200_s32.json): a sender
that scaled its partial by the merged normalisation exp2(m_c - M) / L had to wait for every
chunk's stats and merge them (~460 cycles a CTA, ~32 MUFU a thread) before staging, on the
slowest CTA's path to its copies. Staged as O_c / l_c it needs only its own sum; the owner,
which waits for the blocks anyway, computes each chunk's weight l_c exp2(m_c - M) / L for its
one head a thread (12 MUFU) while they land. KV rotated past the L2, three rounds a device
call, width 640 T = 12 5.14-5.18 -> 5.07-5.09 us, T = 1 4.29-4.33 -> 4.21-4.22, T = 48
11.18-11.28 -> 11.13-11.15. Measured with it and dropped (same record, patches in gpu/candidates/): the
stats sent after the second product's issue (0.15 us slower at T = 12), or by every warp straight after
its sums (0.3), the first half's blocks sent as soon as staged (0.25), and the copies gated on a signal
of their own rather than the stats' arrival: owners' "receive slots free" after the softmax's first
barrier (0.5) or "own partial staged" (0.65-0.7).

Measured and dropped in the thirty-third session (sparse_mla_ab_h200_s33.json, patch
gpu/candidates/mla_s33_candidates.diff): the cluster barrier's phase-0 wait moved from step 6 into the
gather, right after the copies are issued, is 0.25-0.27 us slower at width 640 (T = 1, 12 and 48 alike):
in SASS it is UCGABAR_WAIT + CCTL.IVALL, and with the gather in flight it costs about what the per-K-block
overlap of the score MMAs and V^T fragments with the landing rows is worth. Moved to where the warps
wait for the last score MMAs, it is no faster (5.03 against 5.00 us at T = 12), nor just after the
grid-dependency wait. In the prologue, before griddepcontrol.wait (where PDL overlaps it with the previous
grid), it measured 0.03 us faster at T = 1 in two device calls, but at T = 12 4.97 against 5.01 us in one
and 5.05 against 4.98 in the other (T = 48 10.96 / 10.94, 11.18 / 11.04): no gain where the target is,
so step 6 keeps it. The softmax's reduction
area laid out [head][warp] for 16-byte loads measured neutral on its own and 0.15 us slower at width 640
with the word stores of P^T.

Why the partials travel as FP16: the reduction is bound by the bytes crossing distributed
shared memory (each owner receives n - 1 blocks), and FP16 halves them (measured on the H200,
T = 12, width 640, L2-warm: 5.79 -> 5.18 us). The sm_100a original rounds them to BF16; FP16
keeps 3 more bits, and its range is safe because a staged partial is normalised by its chunk's
softmax sum (O_c / l_c, without bmm2_scale): |partial| <= max |kv| <= 448, times at most 1 + 2^-4
for P's E4M3 rounding. The rounding adds at most 2^-11 of sum_c p_c |kv_c| to an output (before
bmm2_scale), as the owner's weights are at most 1.

Why V^T comes from registers: Hopper's FP8 WGMMA reads shared-memory operands K-major
only, and V (the same tile as K) is stored with the head dims contiguous, i.e. MN-major
for O^T = V^T P^T. The alternatives cost more: a shared-memory transpose writes and
re-reads the 64 KiB tile (and needs a second tile or a serialised pipeline within the
113 KB budget); BF16 for the second product doubles the tile (128 KiB) or its traffic.
With A from registers, one ldmatrix.x4.trans per 16x32 warp fragment plus four byte
permutes build the K-major fragment directly from the swizzled tile (32 ldmatrix and
128 prmt per thread for the whole chunk); the head-dim order inside each fragment is
permuted (lane group g holds dims 2g, 2g+1), which the epilogue undoes for free.
Measured on the H200 (R2, L2-warm graph replay, T = 12, width 640): leaving the second
product out entirely saves 0.67 us of 5.87 us, so no route for V can save more than that;
per-step clocks put it at ~1470 cycles from the softmax's end to the last MMA issued. About
650 of them were the first half's fragment building: built before the softmax ends, the step
takes ~830 (twenty-third session), so those fragments were built after the softmax's max
barrier, where the warps otherwise wait (since the thirty-first session at n = 1 only, and each
ldmatrix conflict-free: see "Where the V^T fragments are built"). The rest is MMA issue (N = 16 is the warpgroup MMA's
least efficient shape) with the second half's fragments overlapping the first half's MMAs.
Where the first half's fragments are built was measured with the bank-conflicted ldmatrix
(sparse_mla_ab_h200_s23.json; KV rotated past the L2, T = 12, width 640, committed build
5.74-5.76 us in the same runs): after
the max barrier 5.49-5.56 us; during the gather, after each K block's MMAs, 5.61; after the
score wait 5.76; all eight tiles after the max barrier 5.57, six 5.93, two 5.72. The softmax
mask in predicates belongs to it: the same placement with the mask read from shared memory
measured 5.83, the mask alone 5.87.
Warp-level mma.sync is no way out: Hopper has no FP8 mma.sync (ptxas lowers it to FP16
conversions and HMMA), and a microbenchmark of one warp's share of O = P V with FP16 HMMA
(gpu/micro/pv_route.cu, ninth session) took 2250 cycles for the MMAs alone and 3070 with
the FP8 -> FP16 conversions, against ~1900 for this route's issue and wait.

Where the V^T fragments are built (thirty-first session, sparse_mla_ab_h200_s31.json; KV rotated past the L2,
three rounds): first, each ldmatrix matrix now reads eight consecutive tile rows, one swizzle atom, with the
second product's K order permuted to match (_pv_k, P^T stored in that order). Read in K order its rows r and
r + 8 shared banks: Nsight Compute counted 32.8 K shared-load bank conflicts a launch at T = 12 width 640, 2.1 K
after; the softmax step 1216 -> 924 cycles, the second product's issue 820 -> 587. Width 640 T = 1 4.58-4.61 ->
4.44-4.48 us, T = 12 5.37-5.44 -> 5.29-5.42, T = 48 11.8-11.9 -> 11.4-11.5; width 128 T = 1 3.64-3.69 -> 3.29-3.33,
T = 12 3.74-3.80 -> 3.47-3.56. With the cheaper ldmatrix, the clusters measured fastest with every tile's fragments
built during the gather, after each K block's score MMAs, where the warps wait for the next K block: width 640
T = 12 5.22-5.28 us (the first half's there and the second's during the first half's MMAs 5.32-5.35; both after
the softmax's max barrier 5.29-5.42), T = 1 4.38-4.39, T = 48 11.36-11.51. Width 128, with no cluster exchange to
wait for, keeps the twenty-third session's placement: during the gather it measured 3.57 / 3.77 / 4.28 us at
T = 1 / 12 / 48 against 3.33 / 3.49-3.56 / 3.97-3.99.

Measurement switches (never set for the committed cache): SPARSE_MLA_EXPERIMENT=skip_pv /
timeline at build time (per-step SM clocks written over q), used for the measurements above.
(An earlier "push" route, DSMEM stores from registers into a separate 32 KiB buffer instead of
the bulk copies, measured 0.15 us faster with FP32 partials; it is not kept.)
(Its FP16 form, every thread sending 16-byte pieces of the staged blocks by st.async.v4 onto the
owner's slot mbarrier instead of thread 0's bulk copies, measured 0.3 us slower at T = 12 width 640:
sparse_mla_ab_h200_s31.json, push_st_async; patch in gpu/candidates/mla_push_s31.diff.)
Measured slower on the H200 and dropped (benchmarks/results/sparse_mla_ab_h200_s9.json): sending
each half's blocks as soon as it is staged (into a separate receive buffer, or into the owner's
KV tile after a cluster barrier at the second product's issue), owners pulling the staged blocks
with shared::cluster loads, an L2::256B hint or per-row L2 bulk prefetches on the gather.
Why an mbarrier per receive slot (twenty-fourth session, sparse_mla_ab_h200_s24.json): the reduce step is bound
by the bytes crossing distributed shared memory (a cluster's 64 KiB of FP16 partials take ~1100 cycles; halving
them saved 0.6 us, and spreading them over five owners saved nothing). With one mbarrier for all blocks an owner
began adding when the last block landed; with one a slot it adds each block as it lands, so only the last
block's sum follows the last copy (the owners' step max 1445 -> 1219 cycles). KV cold, width 640, in two device
calls: T = 12 5.46-5.50 -> 5.33-5.49 us, T = 48 11.98-12.06 -> 11.70-12.02; L2-warm T = 12 4.55 -> 4.39-4.43.
Measured with it and dropped: the middle cluster barrier's arrive right after the second product's issue (the
receive slot is free then; 0.08 us slower), sending the first half's blocks as soon as they are staged, and a
CTA-scope wait on the stats (neither faster).
Why the partials go to four owners of 128 dims (twenty-third session, sparse_mla_ab_h200_s23.json): a
reduce-scatter over all five CTAs (blocks of 104 dims, 17 % fewer bytes into the busiest CTA) measured 0.08 us
slower (5.69 against 5.61 us with the KV cold; gpu/candidates/mla_s23_candidates.diff, MLA_SCATTER). On top of the
rotated sends and the per-slot mbarriers (twenty-fourth session, candidate S5 in gpu/candidates/mla_s24_candidates.diff)
it measured no faster either: T = 12 5.38 against 5.38 us, T = 1 4.60 against 4.64, T = 48 11.90 against 11.80.
Why the gather stays cp.async (twenty-first session, sparse_mla_ab_h200_s21.json): a microbenchmark of the gather
alone (gpu/micro/gather_route.cu; 60 CTAs, as at T = 12 width 640, each 128 random 512-byte rows, cold) takes 3.10 us
a launch this way and 3.06 us with one bulk copy a row (which would need an unswizzled layout), against 0.98 us
without the gather; 128-byte bulk or TMA copies, register loads, a warp a row and L2 prefetches are slower. Taking
the chunk in two halves of 64 rows (half 0's softmax and second product while half 1 lands) was 0.3 us slower
L2-warm and no faster cold: the random rows' latency tail lands half 0 late (gpu/candidates/mla_row_halves.diff).
"""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8

from runtime.contract import sparse_mla_decode as contract

from . import ptx
from .compile import SPARSE_MLA_SWITCH, contract_pointers, cubin_of, null_stream

LOG2E = 1.4426950408889634
NEG_BIG = contract.NEG_BIG  # finite stand-in for -inf in (max, sum) algebra: keeps 0 * ... free of NaN
HEADS = contract.HEADS
DIM = contract.HEAD_DIM
ROWS = contract.CHUNK  # KV rows per CTA
ROW_BYTES = DIM  # FP8

# Shared-memory map (bytes from a 1024-aligned base).
KV_OFF = 0  # 4 K blocks x [128 rows x 128 B], 128B swizzle
KV_KBLOCK = ROWS * 128
Q_OFF = KV_OFF + 4 * KV_KBLOCK  # 4 K blocks x [16 heads x 128 B]
Q_KBLOCK = HEADS * 128
P_OFF = Q_OFF + 4 * Q_KBLOCK  # [16 heads x 128 rows] E4M3, 128B swizzle
RED_OFF = P_OFF + HEADS * 128  # max[4 warps][16], sum[4 warps][16] (f32)
STATS_OFF = RED_OFF + 2 * 4 * HEADS * 4  # (m, l)[5 chunks][16 heads] (f32 pairs), written by peers
MAX_CHUNKS = 5  # CTAs a cluster: the stats area and the receive slots' mbarriers are sized for it
MBAR_OFF = STATS_OFF + 2 * MAX_CHUNKS * HEADS * 4  # [s < 4]: receive slot s's partial-O block, [4]: stats
STATS_MBAR = (MAX_CHUNKS - 1) * 8
SINK_OFF = MBAR_OFF + STATS_MBAR + 8  # n == 1: sink[16] * log2(e) (f32), stored before the dependency wait
SMEM_END = SINK_OFF + HEADS * 4
# Reduction (after the second MMA): own partial O staged in the KV tile's first quarter,
# peers' blocks received into its second (FP16 blocks of 4 KiB, OWNERS of them each).
BLOCK_DIMS = 128
BLOCK_BYTES = HEADS * BLOCK_DIMS * 2  # one 128-dim block of partial O, FP16
OWNERS = DIM // BLOCK_DIMS  # CTAs 0..3 each sum and store one block; CTA 4 (n = 5) owns none
STAGE_OFF = KV_OFF
RECV_OFF = KV_OFF + OWNERS * BLOCK_BYTES
assert SMEM_END + 1023 <= contract.SMEM_BYTES


def _swz(row, chunk16):
    """Byte offset of 16-byte chunk ``chunk16`` of 128-byte row ``row`` in a 128B-swizzled tile."""
    return row * 128 + _swz_in_row(row, chunk16)


def _swz_in_row(row, chunk16):
    """_swz's offset within the row: the chunk XOR-swizzled by the row's low three bits."""
    return (chunk16 ^ (row & 7)) << 4


class SparseMlaDecodeSm90:
    """Sparse-MLA decode of tokens with up to ``width`` columns; ``has_sinks`` adds the sink term."""

    def __init__(self, width: int, has_sinks: bool, smem_bytes: int, reduce: str = "bulk"):
        assert width % ROWS == 0
        self.n = width // ROWS
        # Reduction ownership: block b of OWNERS goes to CTA b; one receive slot per peer.
        assert self.n == 1 or OWNERS <= self.n <= MAX_CHUNKS, "cluster reduction needs n == 1 or 4 <= n <= 5"
        assert (self.n - 1) * BLOCK_BYTES <= 4 * KV_KBLOCK - 4 * BLOCK_BYTES
        self.width = width
        self.has_sinks = has_sinks
        # Issue order of a half's 16 second-product MMAs (tile i, K step ks). n == 1: K steps outer,
        # so the four tiles' accumulator chains interleave (H200, ninth session: width 128 0.13 us
        # faster at T = 1, 12 and 48); clusters keep tiles outer (width 640 measured no faster).
        if self.n == 1:
            self.pv_order = [(i, ks) for ks in range(4) for i in range(4)]
        else:
            self.pv_order = [(i, ks) for i in range(4) for ks in range(4)]
        # Where the second product's V^T fragments are built (see "Where the V^T fragments are built"):
        # clusters, all eight tiles during the gather, each K block's two tiles after its score MMAs;
        # n == 1, the first half's after the softmax's max barrier and the second half's during the
        # first half's MMAs.
        self.frags_in_gather = self.n > 1
        # The cluster's partial-O copies need no cluster barrier only because no KV tile is read after
        # the gather's fragments (step 9).
        assert self.n == 1 or self.frags_in_gather
        self.smem_bytes = smem_bytes
        # The contract's only route: staging + bulk copies into the owner's KV tile (DESIGN.md).
        assert reduce == "bulk"
        # Timing experiment (never in a committed cache): leave out the second product.
        self.skip_pv = os.environ.get(SPARSE_MLA_SWITCH) == "skip_pv"
        self.timeline = os.environ.get(SPARSE_MLA_SWITCH) == "timeline"

    @cute.jit
    def __call__(self, out: cute.Pointer, q: cute.Pointer, swa_kv: cute.Pointer, ckv: cute.Pointer,
                 indices: cute.Pointer, lens: cute.Pointer, sinks: cute.Pointer, swa_rows: Int32,
                 c_rows: Int32, bmm1_scale: Float32, bmm2_scale: Float32, stream):
        # The runtime sets the grid (T * n CTAs); this one only has to be a multiple of n.
        self.kernel(out, q, swa_kv, ckv, indices, lens, sinks, swa_rows, c_rows, bmm1_scale,
                    bmm2_scale).launch(grid=[self.n, 1, 1], block=[contract.THREADS, 1, 1], cluster=[self.n, 1, 1],
                                       smem=self.smem_bytes, stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Pointer, q: cute.Pointer, swa_kv: cute.Pointer, ckv: cute.Pointer,
               indices: cute.Pointer, lens: cute.Pointer, sinks: cute.Pointer, swa_rows: Int32,
               c_rows: Int32, bmm1_scale: Float32, bmm2_scale: Float32):
        n = self.n
        tid, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        tid = Int32(tid)
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2  # accumulator row group
        t4 = lane & 3  # accumulator column pair
        token = Int32(bidx) // n
        chunk = Int32(bidx) - token * n  # == rank in the cluster (cluster along x)

        raw = cute.arch.get_dyn_smem(Uint8, alignment=1024).toint()
        base = (raw + 1023) & ~1023
        s_kv = base + KV_OFF
        s_q = base + Q_OFF
        s_p = base + P_OFF
        s_red = base + RED_OFF
        s_stats = base + STATS_OFF
        s_mbar = base + MBAR_OFF

        heads = _acc_heads(t4)

        # step 1: sinks (weights of the model, never written by the previous grid).
        tl = self._mark([], tid)
        owner_sink2 = Float32(NEG_BIG)
        if cutlass.const_expr(self.has_sinks):
            sinks_addr = sinks.toint()
            if cutlass.const_expr(n == 1):
                # Head tid's sink, for every thread's factors (_factors), through shared memory: ptxas placed
                # a thread's four loads held in registers for step 8 below the wait; the store keeps the load
                # above it (SASS: LDG.E.CONSTANT, STS, ACQBULK).
                if tid < HEADS:
                    ptx.st_shared_f32(base + SINK_OFF + tid * 4,
                                      ptx.ld_global_nc_f32(sinks_addr + Int64(tid) * 4) * LOG2E)
            else:
                # This thread's four heads' sinks, which n > 1 never uses (ptxas drops the loads): dropped from the
                # PTX too, width 640's register allocation changed and the kernel measured 0.1 us slower at every T
                # (gpu/candidates/mla_sinks_smem_s80.diff, H100).
                _ = [ptx.ld_global_nc_f32(sinks_addr + Int64(h) * 4) * LOG2E for h in heads]
                # The sink of the head this thread reduces as a block owner (_reduce_store).
                owner_sink2 = ptx.ld_global_nc_f32(sinks_addr + Int64(tid >> 3) * 4) * LOG2E
        if cutlass.const_expr(n > 1):
            if tid == 0:
                for slot in cutlass.range_constexpr(n - 1):
                    ptx.mbarrier_init(s_mbar + 8 * slot, 1)  # one peer's partial-O block (bulk copy)
                ptx.mbarrier_init(s_mbar + STATS_MBAR, 1)  # every chunk's (m, l) (st.async)
                # The n chunks' stats (8 bytes per head) complete this phase's transactions.
                ptx.mbarrier_arrive_expect_tx(s_mbar + STATS_MBAR, n * HEADS * 8)
                if chunk < OWNERS:
                    # An owner's receive slots expect their block from the start: peers send as soon as
                    # their own partial O is staged, with no cluster barrier first (see step 9).
                    for slot in cutlass.range_constexpr(n - 1):
                        ptx.mbarrier_arrive_expect_tx(s_mbar + 8 * slot, BLOCK_BYTES)
                ptx.fence_mbarrier_init_cluster()
            # Phase 0 of the cluster barrier: peers exist and their mbarriers are initialised
            # before anyone stores into their shared memory (waited on in step 6).
            cute.arch.cluster_arrive_relaxed()

        # step 2: everything below reads what the previous grid may have written.
        cute.arch.griddepcontrol_wait()
        tl = self._mark(tl, tid)  # 1: dependency released
        c16 = tid & 7  # 16-byte chunk of a 128-byte K block this thread copies
        r0 = tid >> 3  # rows r0 + 16 i (i < 8) of the KV tile, head r0 of Q
        # The query needs no index: its copies go first (they join K block 0's async group).
        q_src = q.toint() + Int64(token) * (HEADS * DIM) + Int64(r0 * DIM + c16 * 16)
        for kb in cutlass.range_constexpr(4):
            ptx.cp_async_16(s_q + kb * Q_KBLOCK + _swz(r0, c16), q_src + kb * 128, 16)
        rows = swa_rows
        pool = swa_kv.toint()
        if cutlass.const_expr(n > 1):
            # Chunk 0 indexes the sliding-window pool, the others the compressed pool.
            is_c = chunk > 0
            rows = Int32(cutlass.select_(is_c, c_rows, swa_rows))
            pool = Int64(cutlass.select_(is_c, ckv.toint(), pool))
        tok_len = ptx.ld_global_s32(lens.toint() + Int64(token) * 4)
        idx_row = indices.toint() + (Int64(token) * self.width + Int64(chunk * ROWS)) * 4
        # Each thread reads the indices of the rows it copies straight from global memory (eight
        # threads share a row: one L1 line), so the gather waits for one load, not load + barrier.
        row_off = []
        row_bytes = []
        for i in cutlass.range_constexpr(8):
            r = r0 + 16 * i
            ix = ptx.ld_global_s32(idx_row + Int64(r) * 4)
            ok = (r + chunk * ROWS < tok_len) & (ix >= 0) & (ix < rows)
            row_off.append(Int64(Int32(cutlass.select_(ok, ix, Int32(0)))) * ROW_BYTES + Int64(c16 * 16))
            row_bytes.append(Int32(cutlass.select_(ok, Int32(16), Int32(0))))

        # step 3: gather, one async group per K block; a masked row is zero-filled, never read.
        for kb in cutlass.range_constexpr(4):
            for i in cutlass.range_constexpr(8):
                ptx.cp_async_16(s_kv + kb * KV_KBLOCK + _swz(r0 + 16 * i, c16), pool + row_off[i] + kb * 128,
                                row_bytes[i])
            cute.arch.cp_async_commit_group()
        tl = self._mark(tl, tid)  # 2: gather issued (indices landed)
        # The softmax's row mask for this thread's accumulator rows (64 mt + 16 warp + g, + 8), kept
        # in predicates: the loads hit the index lines the gather just read (L1) and land while the
        # gather does, so the softmax reads no shared memory for it.
        row_ok = []
        for mt in cutlass.range_constexpr(2):
            for half in cutlass.range_constexpr(2):
                rr = 64 * mt + 16 * warp + g + 8 * half
                ix = ptx.ld_global_s32(idx_row + Int64(rr) * 4)
                row_ok.append((rr + chunk * ROWS < tok_len) & (ix >= 0) & (ix < rows))

        # step 4: S^T[128 rows, 16 heads] = KV x Q^T, one batch of MMAs per landed K block.
        # Each K block (K = 128) accumulates in its own registers and the four partial sums are
        # added in FP32 at the end: Hopper's FP8 MMA keeps only about 14 bits when it accumulates
        # into D, which at scores in the hundreds shifts softmax weights by several percent;
        # promoting every 128 products bounds that error to the partial sums' magnitude.
        zero8 = [Float32(0.0)] * 8
        part = []
        frags = [None] * 8  # V^T fragments of the second product's 8 tiles, K steps 0..3 each
        for kb in cutlass.range_constexpr(4):
            cute.arch.cp_async_wait_group(3 - kb)
            ptx.fence_proxy_async_shared()  # cp.async wrote through the generic proxy
            cute.arch.sync_threads()  # every thread's rows have landed
            ptx.wgmma_fence()
            acc = [zero8, zero8]
            for ks in cutlass.range_constexpr(4):
                for mt in cutlass.range_constexpr(2):
                    acc[mt] = ptx.wgmma_m64n16k32_e4m3_ss(
                        acc[mt], s_kv + kb * KV_KBLOCK + mt * 64 * 128 + ks * 32,
                        s_q + kb * Q_KBLOCK + ks * 32, int(ks > 0))
            ptx.wgmma_commit()
            part.append(acc[0] + acc[1])
            if cutlass.const_expr(self.frags_in_gather):
                # K block kb holds head dims 128 kb .. + 127: tiles 2 kb and 2 kb + 1. Built while the
                # warps would otherwise wait for the next K block (or for the score MMAs).
                for i in cutlass.range_constexpr(2 * kb, 2 * kb + 2):
                    frags[i] = self._v_fragments(s_kv, i, warp, lane)
        # The score MMAs are issued: the next grid may start its prologue.
        cute.arch.griddepcontrol_launch_dependents()
        tl = self._mark(tl, tid)  # 3: all K blocks landed, score MMAs issued
        flat = ptx.wgmma_wait(0, part[0] + part[1] + part[2] + part[3])
        tl = self._mark(tl, tid)  # 4: scores in registers
        tot = [(flat[i] + flat[16 + i]) + (flat[32 + i] + flat[48 + i]) for i in range(16)]
        acc = [tot[0:8], tot[8:16]]

        # step 5: chunk softmax per head, base 2. Thread rows: 64 mt + 16 warp + g (+8).
        scale2 = bmm1_scale * LOG2E
        s = [[Float32(0.0)] * 8, [Float32(0.0)] * 8]
        neg_inf = Float32(float("-inf"))
        mx = [neg_inf] * 4
        for mt in cutlass.range_constexpr(2):
            for i in cutlass.range_constexpr(8):
                ok = row_ok[mt * 2 + ((i >> 1) & 1)]
                v = acc[mt][i] * scale2
                s[mt][i] = Float32(cutlass.select_(ok, v, neg_inf))
                hs = (i >> 2) * 2 + (i & 1)
                mx[hs] = cute.arch.fmax(mx[hs], s[mt][i])
        for hs in cutlass.range_constexpr(4):
            for off in (4, 8, 16):
                mx[hs] = cute.arch.fmax(mx[hs], cute.arch.shuffle_sync_bfly(mx[hs], off))
        if g == 0:
            for hs in cutlass.range_constexpr(4):
                ptx.st_shared_f32(s_red + (warp * HEADS + heads[hs]) * 4, mx[hs])
        cute.arch.sync_threads()
        # n == 1: the first half's V^T fragments (tiles 0-3, K blocks 0 and 1), built here, where the
        # warps otherwise wait on the softmax's chains of shuffles, barriers and exp2: the second
        # product's first MMAs then issue at once (see "Where the V^T fragments are built").
        if cutlass.const_expr(not self.frags_in_gather):
            for i in cutlass.range_constexpr(4):
                frags[i] = self._v_fragments(s_kv, i, warp, lane)
        m_c = [neg_inf] * 4
        for hs in cutlass.range_constexpr(4):
            for w in cutlass.range_constexpr(4):
                m_c[hs] = cute.arch.fmax(m_c[hs], ptx.ld_shared_f32(s_red + (w * HEADS + heads[hs]) * 4))
            # An all-masked chunk has m = -inf: subtract a finite stand-in so exp2 gives 0, not NaN.
            m_c[hs] = cute.arch.fmax(m_c[hs], Float32(NEG_BIG))
        lsum = [Float32(0.0)] * 4
        p = [[Float32(0.0)] * 8, [Float32(0.0)] * 8]
        for mt in cutlass.range_constexpr(2):
            for i in cutlass.range_constexpr(8):
                hs = (i >> 2) * 2 + (i & 1)
                p[mt][i] = ptx.ex2(s[mt][i] - m_c[hs])
                lsum[hs] = lsum[hs] + p[mt][i]
        for hs in cutlass.range_constexpr(4):
            for off in (4, 8, 16):
                lsum[hs] = lsum[hs] + cute.arch.shuffle_sync_bfly(lsum[hs], off)
        if g == 0:
            for hs in cutlass.range_constexpr(4):
                ptx.st_shared_f32(s_red + ((4 + warp) * HEADS + heads[hs]) * 4, lsum[hs])
        self._store_p(s_p, p, heads, warp, g)
        ptx.fence_proxy_async_shared()  # P^T is read by WGMMA (async proxy)
        cute.arch.sync_threads()

        tl = self._mark(tl, tid)  # 5: softmax done, P^T stored
        # step 6: this chunk's (m, l) per head to every CTA of the cluster.
        if cutlass.const_expr(n > 1):
            cute.arch.cluster_wait()  # phase 0: peers resident, mbarriers initialised
            if tid < HEADS * n:
                sh = tid & (HEADS - 1)
                dst = tid >> 4
                mm = Float32(NEG_BIG)
                ll = Float32(0.0)
                for w in cutlass.range_constexpr(4):
                    mm = cute.arch.fmax(mm, ptx.ld_shared_f32(s_red + (w * HEADS + sh) * 4))
                    ll = ll + ptx.ld_shared_f32(s_red + ((4 + w) * HEADS + sh) * 4)
                # st.async completes on the receiver's mbarrier: no release fence (a GPU-scope
                # membar in SASS) and no cluster barrier phase for the exchange.
                ptx.st_async_v2_f32(ptx.mapa_shared(s_stats + (chunk * HEADS + sh) * 8, dst), mm, ll,
                                    ptx.mapa_shared(s_mbar + STATS_MBAR, dst))

        tl = self._mark(tl, tid)  # 6: stats sent
        # step 7: O^T[512 dims, 16 heads] = V^T x P^T, 8 m64 tiles of head dims, K = 128 rows.
        # Two halves of four tiles: one wgmma.fence orders a half's fragment registers before its
        # 16 MMAs (a fence per tile costs a warpgroup arrive each); at n == 1 the second half's
        # ldmatrix/prmt overlap the first half's MMAs.
        o = []
        for half in cutlass.range_constexpr(2 if not self.skip_pv else 0):
            if cutlass.const_expr(half == 1 and not self.frags_in_gather):
                for i in cutlass.range_constexpr(4, 8):
                    frags[i] = self._v_fragments(s_kv, i, warp, lane)
            ptx.wgmma_fence()
            tile_acc = [zero8] * 4
            for i, ks in self.pv_order:
                tile_acc[i] = ptx.wgmma_m64n16k32_e4m3_rs(tile_acc[i], frags[4 * half + i][ks], s_p + ks * 32,
                                                          int(ks > 0))
            o.extend(tile_acc)
            ptx.wgmma_commit()
        if cutlass.const_expr(self.skip_pv):
            o = [zero8] * 8  # timing experiment only: what the second product costs

        tl = self._mark(tl, tid)  # 7: second product issued
        # step 8 (while the second product runs): each head's factor for the partial O.
        factor = self._factors(s_red, base + SINK_OFF, heads, m_c, bmm2_scale)
        tl = self._mark(tl, tid)  # 8: factors ready

        if cutlass.const_expr(n == 1):
            # One chunk: nothing to reduce. BF16 pairs straight from the accumulators; a warp's
            # store covers 4 heads x 32 contiguous bytes (whole sectors).
            if cutlass.const_expr(not self.skip_pv):
                o = self._wait_tiles(0, o, 0, 8)
            out_tok = out.toint() + Int64(token) * (HEADS * DIM * 2)
            for mt in cutlass.range_constexpr(8):
                d = mt * 64 + 16 * warp + 2 * g
                for jj in cutlass.range_constexpr(2):
                    for cc in cutlass.range_constexpr(2):
                        hs = jj * 2 + cc
                        i0 = 4 * jj + cc  # (dim 2g, head), i0 + 2 = (dim 2g + 1, head)
                        ptx.st_global_b32(out_tok + Int64((heads[hs] * DIM + d) * 2),
                                          ptx.cvt_bf16x2(o[mt][i0] * factor[hs], o[mt][i0 + 2] * factor[hs]))
            tl = self._mark(tl, tid)  # 9: stored
            tl = self._mark(tl, tid)  # 10
            tl = self._mark(tl, tid)  # 11
            tl = self._mark(tl, tid)  # 12
        else:
            # step 9: partial O (O_c / l_c, FP16 pairs) staged in the own KV tile, block b (128 dims)
            # for CTA b % n; a thread holds dims 2g, 2g + 1 of each warp's 16-dim group. The first
            # half's tiles (blocks 0, 1) are staged while the second half's MMAs still run: they
            # overwrite K block 0, read last by the fragments' ldmatrix during the gather, before the
            # softmax's CTA barriers. (A barrier of its own here measured about 0.04 us slower at width 640
            # T = 12 and 0.07 at T = 48, KV rotated: sparse_mla_ab_h200_s32.json.)
            for mt in cutlass.range_constexpr(8):
                if cutlass.const_expr(mt % 4 == 0 and not self.skip_pv):
                    o = self._wait_tiles(1 - mt // 4, o, mt, mt + 4)
                blk = mt // 2
                dib = (mt % 2) * 64 + 16 * warp + 2 * g
                for jj in cutlass.range_constexpr(2):
                    for cc in cutlass.range_constexpr(2):
                        hs = jj * 2 + cc
                        i0 = 4 * jj + cc  # (dim 2g, head), i0 + 2 = (dim 2g + 1, head)
                        a = s_kv + STAGE_OFF + blk * BLOCK_BYTES + _stage_off(heads[hs], dib)
                        ptx.st_shared_b32(a, ptx.cvt_f16x2(o[mt][i0] * factor[hs], o[mt][i0 + 2] * factor[hs]))
            ptx.fence_proxy_async_shared()  # staging is read by bulk copies (async proxy)
            # The CTA barrier orders the staging writes (fenced to the async proxy) before the copies.
            # No cluster barrier: each receiving KV tile is free already. A peer's tile is read only by
            # its score MMAs and its V^T fragments' ldmatrix (all built during the gather at n > 1),
            # both before it sent its stats; the sending lane's stats wait (a cluster-scope acquire of
            # every peer's st.async) orders those reads before its copy. Measured against a relaxed
            # cluster barrier here (sparse_mla_ab_h200_s31.json, early_sends; KV rotated, three rounds):
            # width 640 T = 12 5.17-5.22 -> 5.09-5.12 us, T = 1 4.33-4.35 -> 4.25-4.27, T = 48
            # 11.29-11.92 -> 11.10-11.23. Sending the first half's blocks before the second half is
            # staged measured the same (5.11-5.12 at T = 12).
            tl = self._mark(tl, tid)  # 9: staged
            cute.arch.sync_threads()
            tl = self._mark(tl, tid)  # 10: CTA barrier passed (a cluster barrier until the thirty-first session)
            # Lane 0 of warp k - 1 makes the k-th of the rotated sends: one bulk copy a warp, issued side by
            # side (thread 0 issuing all four measured 0.05-0.08 us slower at width 640 T = 12 and about 0.2 at
            # T = 48, KV rotated: sparse_mla_ab_h200_s32.json).
            if lane == 0:
                if warp < n - 1:
                    ptx.mbarrier_wait_parity(s_mbar + STATS_MBAR, 0)  # every chunk's stats have landed
                    self._send_block(s_kv, s_mbar, chunk, warp + 1, n)
            # Last cluster barrier: no CTA exits while a peer's bulk copy may still read its staging. An owner
            # arrives once every block into it has landed (in _reduce_store, before its stores),
            # a CTA that owns no block at once; so the phase completes when every copy has landed.
            # Relaxed: no data is published here, and a release would wait for global stores.
            if chunk < OWNERS:
                self._reduce_store(out, s_kv, s_kv + RECV_OFF, s_mbar, s_stats, owner_sink2, token, chunk, tid, n,
                                   bmm2_scale)
            else:
                cute.arch.cluster_arrive_relaxed()
            tl = self._mark(tl, tid)  # 11: blocks received, summed, stored
            cute.arch.cluster_wait()
            tl = self._mark(tl, tid)  # 12: last cluster barrier passed
        if cutlass.const_expr(self.timeline):
            # Timing experiment: thread 0's clock marks (and the global timer at start and end)
            # overwrite this token's query bytes [chunk * 64, + 64): never in a committed cache.
            if tid == 0:
                tl_dst = q.toint() + Int64(token) * (HEADS * DIM) + Int64(chunk * 64)
                ptx.st_global_v4_b32(tl_dst, tl[0], tl[1], tl[2], tl[3])
                ptx.st_global_v4_b32(tl_dst + 16, tl[4], tl[5], tl[6], tl[7])
                ptx.st_global_v4_b32(tl_dst + 32, tl[8], tl[9], tl[10], tl[11])
                ptx.st_global_v4_b32(tl_dst + 48, tl[12], tl[13], self._gtime(), Int32(bidx))

    @cute.jit
    def _store_p(self, s_p: Int32, p, heads, warp: Int32, g: Int32):
        """P^T[head, k] as E4M3 (x256) into the swizzled K-major tile, k = _pv_k(row), in whole words.

        Thread (g, t4) holds rows rr = 64 mt + 16 warp + g and rr + 8 of its four heads: bytes _pv_k(rr) and
        _pv_k(rr) + 2 of the head's row, i.e. bytes (g & 1) and (g & 1) + 2 of the word at 4 ((g >> 1) & 3)
        of its 16-byte chunk. Lanes g and g ^ 1 together hold the whole word of each head, so one shuffle a
        tile swaps half of the pairs and each lane stores two heads' words: the even lane heads[0, 1], the
        odd heads[2, 3]. Four 4-byte stores a thread instead of sixteen byte stores (H200, KV rotated past
        the L2, sparse_mla_ab_h200_s33.json). Width 128, where the first half's V^T fragments' ldmatrix
        share the memory pipe with these stores: the timeline's softmax step 918 -> 870 cycles, T = 12
        3.48-3.52 -> 3.44-3.48 us in two calls. Width 640 (fragments built during the gather): the step
        746 -> 768 cycles (the shuffle's latency), the A/B rounds within their spread (T = 12 medians 5.05
        -> 5.00 in one call, 5.035 -> 5.055 in another); kept for one definition of the P^T tile.
        """
        odd = (g & 1) == 1
        for mt in cutlass.range_constexpr(2):
            rr = 64 * mt + 16 * warp + g
            # One conversion gives both bytes of a head: row rr in the low byte, rr + 8 in the high.
            pairs = [ptx.cvt_e4m3x2(p[mt][i] * 256.0, p[mt][i + 2] * 256.0) for i in (0, 1, 4, 5)]
            send = Int32(cutlass.select_(odd, ptx.prmt(pairs[0], pairs[1], P_PAIRS_PACK),
                                         ptx.prmt(pairs[2], pairs[3], P_PAIRS_PACK)))
            recv = cute.arch.shuffle_sync_bfly(send, 4)  # lane ^ 4: g ^ 1, same t4
            for j in cutlass.range_constexpr(2):
                word_even = ptx.prmt(pairs[j], recv, P_WORD_EVEN[j])
                word_odd = ptx.prmt(pairs[2 + j], recv, P_WORD_ODD[j])
                word = Int32(cutlass.select_(odd, word_odd, word_even))
                h = Int32(cutlass.select_(odd, heads[2 + j], heads[j]))
                ptx.st_shared_b32(_p_word_addr(s_p, h, rr, g), word)

    @cute.jit
    def _send_block(self, s_kv: Int32, s_mbar: Int32, chunk: Int32, k: Int32, n: cutlass.Constexpr):
        """Step k (0 < k < n) of the rotated sends: the staged block of owner (chunk + k) mod n, if that CTA owns
        one, by bulk copy into its receive slot for this chunk. Each CTA sends first to the next owner after
        itself, so the owners' blocks arrive side by side rather than all at owner 0 first
        (sparse_mla_ab_h200_s23.json: width 640 0.02-0.05 us faster with the KV cold, 0.04-0.13 us L2-warm)."""
        owner = _rotated(chunk, k, n)
        if owner < OWNERS:  # block `owner` (n > OWNERS: CTAs OWNERS.. own none)
            slot = _recv_slot(chunk, owner)
            dst = ptx.mapa_shared(s_kv + RECV_OFF + slot * BLOCK_BYTES, owner)
            ptx.bulk_copy_to_peer(dst, s_kv + STAGE_OFF + owner * BLOCK_BYTES, BLOCK_BYTES,
                                  ptx.mapa_shared(s_mbar + 8 * slot, owner))

    def _factors(self, s_red: Int32, s_sink: Int32, heads, m_c, bmm2_scale: Float32):
        """Each of this thread's 4 heads' factor for its partial O (n > 1: 1 / (256 l_c); n = 1: the whole
        normalisation, bmm2_scale 2^(m_c - M) / (256 L), with the sinks step 1 stored at s_sink), from the
        chunk's sums in s_red."""
        l_c = [Float32(0.0)] * 4
        for hs in range(4):
            for w in range(4):
                l_c[hs] = l_c[hs] + ptx.ld_shared_f32(s_red + ((4 + w) * HEADS + heads[hs]) * 4)
        factor = []
        for hs in range(4):
            if cutlass.const_expr(self.n > 1):
                # A cluster stages O_c / l_c, normalised by this chunk's own sum only: no peer's stats on the
                # way to the copies. Each owner weighs the chunks' blocks by the merged stats (_reduce_store).
                # An all-masked chunk has l_c = 0 and O_c = 0: the clamp keeps its block 0.
                factor.append((1.0 / 256.0) * cute.arch.rcp_approx(cute.arch.fmax(l_c[hs], Float32(1e-30))))
            else:
                sink2 = Float32(NEG_BIG)
                if cutlass.const_expr(self.has_sinks):
                    sink2 = ptx.ld_shared_f32(s_sink + heads[hs] * 4)
                big_m, big_l = self._merge_stats([m_c[hs]], [l_c[hs]], sink2)
                factor.append(bmm2_scale * (1.0 / 256.0) * ptx.ex2(m_c[hs] - big_m) * cute.arch.rcp_approx(big_l))
        return factor

    def _merge_stats(self, ms, ls, sink2):
        """Merge the chunks' (m, l) (base 2) and the sink: (M, L), with M the largest of the m_j and the sink
        and L = sum_j l_j 2^(m_j - M) (+ 2^(sink - M)), clamped to a tiny positive value."""
        big_m = sink2
        for m in ms:
            big_m = cute.arch.fmax(big_m, m)
        big_l = Float32(0.0)
        for m, l in zip(ms, ls):
            big_l = big_l + l * ptx.ex2(m - big_m)
        if cutlass.const_expr(self.has_sinks):
            big_l = big_l + ptx.ex2(sink2 - big_m)
        # L >= 1 whenever a column is active; an empty token has O = 0, so any finite factor works.
        # (The callers take rcp.approx of it, 1 ulp, instead of an IEEE division's slow path.)
        return big_m, cute.arch.fmax(big_l, Float32(1e-30))

    def _wait_tiles(self, pending: int, o, lo: int, hi: int):
        """o with tiles [lo, hi) of the second product in registers: wait until at most `pending`
        of its commit groups (a half each) are in flight, passing those tiles' accumulators through."""
        flat = ptx.wgmma_wait(pending, [x for frag in o[lo:hi] for x in frag])
        return o[:lo] + [flat[8 * i:8 * i + 8] for i in range(hi - lo)] + o[hi:]

    def _mark(self, tl, tid):
        """Timing experiment: append this point's SM clock (the first mark: also the global timer)."""
        if cutlass.const_expr(not self.timeline):
            return tl
        if len(tl) == 0:
            return [ptx.clock32(), self._gtime()]
        return tl + [ptx.clock32()]

    def _gtime(self):
        return ptx.globaltimer_lo()

    def _v_fragments(self, s_kv: Int32, mt: int, warp: Int32, lane: Int32):
        """The A fragments of V^T for head-dim tile mt, K steps 0..3 (see _v_fragment)."""
        return [self._v_fragment(s_kv, mt, ks, warp, lane) for ks in range(4)]

    @cute.jit
    def _v_fragment(self, s_kv: Int32, mt: cutlass.Constexpr, ks: cutlass.Constexpr, warp: Int32, lane: Int32):
        """The K-major A fragment of V^T for head-dim tile mt (64 dims) and K step ks (32 rows).

        Warp w covers dims D0 = 64 mt + 16 w .. D0 + 15. ldmatrix.x4.trans reads four 8x8
        b16 matrices, matrix mi from tile rows 32 ks + 8 mi .. + 7 (lane l gives row 32 ks + l):
        eight rows of one swizzle atom, so each matrix is one shared-memory wavefront. Through
        _pv_k those rows are the K indices {0,1,4,5,8,9,12,13} (+2 for the second matrix,
        +16 / +18 for the third / fourth) of the K step; lane (g, t) then holds K indices
        4t, 4t+1 (resp. 4t+2, 4t+3) x dims 2g, 2g+1, and two byte permutes give the
        fragment's rows: M slot g = dim D0 + 2g and M slot g + 8 = dim D0 + 2g + 1.
        """
        kr = 32 * ks + lane
        kb = mt // 2
        c16 = (mt % 2) * 4 + warp
        x = ptx.ldmatrix_x4_trans(s_kv + kb * KV_KBLOCK + _swz(kr, c16))
        return [ptx.prmt(x[0], x[1], 0x6420), ptx.prmt(x[0], x[1], 0x7531),
                ptx.prmt(x[2], x[3], 0x6420), ptx.prmt(x[2], x[3], 0x7531)]

    @cute.jit
    def _reduce_store(self, out: cute.Pointer, s_kv: Int32, s_recv: Int32, s_mbar: Int32, s_stats: Int32,
                      sink2: Float32, token: Int32, blk: Int32, tid: Int32, n: cutlass.Constexpr,
                      bmm2_scale: Float32):
        """Sum the n FP16 partials O_c / l_c of 128-dim block ``blk`` (own staging + received) in FP32, each
        weighed by bmm2_scale l_c 2^(m_c - M) / L from the merged stats, and store BF16; arrive on the last
        cluster barrier once every peer's block is here.

        The weights are the owner's, not the senders': a sender's copies then wait for no merge of the
        cluster's stats (only for their arrival, which orders the receivers' KV reads before the copies),
        and the owner computes its one head's weights while the blocks land.
        Each receive slot has its own mbarrier, and the peers' blocks are added as they land, in the
        order the rotated sends make them arrive (CTA blk - 1's first): only the last block's sum is
        left after the last copy lands. Thread tid takes head tid // 8 and dims 8 (tid % 8) + 64 k,
        k < 2: eight lanes read a head's 128 contiguous bytes of a partial (all 32 banks once) and
        store 128 contiguous bytes.
        """
        h = tid >> 3
        # Every chunk's stats. CTA scope, as for the blocks below: st.async's bytes are made visible by its
        # complete_tx on this CTA's mbarrier (a cluster-scope acquire, with its L1 invalidation, measured
        # about 0.02 us slower at width 640 T = 12, within the rounds' spread: sparse_mla_ab_h200_s32.json).
        ptx.mbarrier_wait_parity(s_mbar + STATS_MBAR, 0, cluster=False)
        stats_h = s_stats + h * 8  # chunk j's (m, l) of head h at + j * HEADS * 8
        ms = [ptx.ld_shared_f32(stats_h + j * HEADS * 8) for j in range(n)]
        ls = [ptx.ld_shared_f32(stats_h + j * HEADS * 8 + 4) for j in range(n)]
        big_m, big_l = self._merge_stats(ms, ls, sink2)
        inv_l = cute.arch.rcp_approx(big_l)
        weight = [bmm2_scale * ls[j] * ptx.ex2(ms[j] - big_m) * inv_l for j in range(n)]
        acc = [Float32(0.0)] * 16  # dims 8 (tid % 8) + 64 k + i at 8 k + i
        acc = self._add_partial(acc, s_kv + STAGE_OFF + blk * BLOCK_BYTES, h, tid, _pick(weight, blk))
        for k in cutlass.range_constexpr(1, n):
            sender = _rotated(blk, -k, n)
            slot = _recv_slot(sender, blk)
            # CTA scope: the bytes are the bulk copy's (async proxy), made visible by its complete_tx
            # on this CTA's mbarrier; a cluster-scope acquire would add an L1 invalidation per wait.
            ptx.mbarrier_wait_parity(s_mbar + 8 * slot, 0, cluster=False)
            acc = self._add_partial(acc, s_recv + slot * BLOCK_BYTES, h, tid, _pick(weight, sender))
        cute.arch.cluster_arrive_relaxed()  # last barrier: no copy reads a peer's staging for this owner any more
        dst = out.toint() + (Int64(token) * HEADS + Int64(h)) * (DIM * 2) + Int64(blk * BLOCK_DIMS * 2)
        for k in cutlass.range_constexpr(2):
            d = (tid & 7) * 8 + 64 * k
            ptx.st_global_v4_b32(dst + Int64(d * 2), *[ptx.cvt_bf16x2(acc[8 * k + 2 * w], acc[8 * k + 2 * w + 1])
                                                       for w in range(4)])

    def _add_partial(self, acc, src, h, tid, weight):
        """acc + weight x this thread's 16 FP16 values of the staged block at ``src`` (see _reduce_store)."""
        acc = list(acc)
        for k in range(2):
            words = ptx.ld_shared_v4_u32(src + _stage_off(h, (tid & 7) * 8 + 64 * k))
            for w in range(4):
                pair = ptx.unpack_f16x2(words[w])
                acc[8 * k + 2 * w] = acc[8 * k + 2 * w] + weight * pair[0]
                acc[8 * k + 2 * w + 1] = acc[8 * k + 2 * w + 1] + weight * pair[1]
        return acc


def _acc_heads(t4):
    """The heads of an accumulator thread's four column slots (lane group t4 of an m64n16 WGMMA accumulator):
    slot hs holds head 8 (hs >> 1) + 2 t4 + (hs & 1)."""
    return [8 * (hs >> 1) + 2 * t4 + (hs & 1) for hs in range(4)]


def _rotated(rank, k, n: int):
    """(rank + k) mod n for 0 <= rank < n and 0 < |k| < n (k < 0 only as a compile-time value): at step k of the
    rotated sends CTA rank sends to _rotated(rank, k, n), and the owner receives from _rotated(owner, -k, n) (one
    wrap, on k's side)."""
    r = rank + k
    if isinstance(k, int) and k < 0:
        return Int32(cutlass.select_(r < 0, r + n, r))
    return Int32(cutlass.select_(r >= n, r - n, r))


def _pick(values: list, i):
    """values[i] for a run-time index i < len(values) (a chain of selects)."""
    picked = values[0]
    for j in range(1, len(values)):
        picked = Float32(cutlass.select_(i == j, values[j], picked))
    return picked


def _recv_slot(sender, owner):
    """The slot of the owner's KV tile that the sender's block lands in: the peers in rank order, the owner skipped
    (the sender's copy and the owner's wait both use it)."""
    return sender - Int32(sender > owner)


def _pv_k(row):
    """The second product's K index of KV tile row ``row`` (a permutation within each 32 rows).

    The A fragment of V^T needs K indices {4t, 4t+1} of a K step from one ldmatrix matrix; read
    in K order, a matrix's rows {0,1,4,5,8,9,12,13} sit two to a swizzle phase of the 128B-swizzled
    tile (rows r and r + 8 share banks): every ldmatrix took two wavefronts a matrix. Numbering K
    so that a matrix reads eight consecutive tile rows makes it one; P^T is stored in that order.
    Row bits (4, 3, 2-1, 0) become K bits (4, 1, 3-2, 0).
    """
    return (row & ~15) | (((row >> 1) & 3) << 2) | (((row >> 3) & 1) << 1) | (row & 1)


# prmt selectors of _store_p (bytes 0-3 from the first operand, 4-7 from the second). A lane sends its pairs
# (low byte row rr, high byte rr + 8) of heads[0], heads[1] (odd lane) or heads[2], heads[3] (even lane) packed in
# one word; the even lane's word of heads[j] is (own rr, peer rr, own rr + 8, peer rr + 8) from its pair j and the
# received word's pair j, the odd lane's (peer rr, own rr, peer rr + 8, own rr + 8) from its pair 2 + j.
P_PAIRS_PACK = 0x5410
P_WORD_EVEN = (0x5140, 0x7160)
P_WORD_ODD = (0x1504, 0x1706)


def _p_word_addr(s_p, h, rr, g):
    """Address in the P^T tile at s_p of the word holding head h's K indices _pv_k(rr) & ~3 .. + 3 (rr's lane group
    g): row h's 16-byte chunk rr >> 4 (_swz, written so that the cubins keep their instruction order), and word
    (g >> 1) & 3 in it."""
    return s_p + h * 128 + (_swz_in_row(h, rr >> 4) | (((g >> 1) & 3) << 2))


def _stage_off(h, d):
    """Byte offset of (head h, dim d) in a staged [16 heads x 128 dims] FP16 block.

    Dims are XOR-swizzled by 16 times bits 1-2 of the head (32 bytes = 8 banks a step): the
    staging's 4-byte stores from the lanes of heads 2t, 2t + 2, 2t + 4, 2t + 6 (t4 = 0..3) then
    fall in four different 8-bank groups. Groups of 16 dims stay contiguous (16-byte reads).
    """
    return (h * BLOCK_DIMS + (d ^ (((h >> 1) & 3) << 4))) * 2


def compile_variant(variant, arch: str) -> bytes:
    op = SparseMlaDecodeSm90(variant.option("width"), variant.option("has_sinks"), variant.smem_bytes,
                             dict(variant.config).get("reduce", "bulk"))
    ptrs = contract_pointers(contract, dict.fromkeys(contract.POINTER_ALIGN, cutlass.Uint8))  # raw byte addresses
    return cubin_of(op, *ptrs, Int32(0), Int32(0), Float32(1.0), Float32(1.0), null_stream(), arch=arch)
