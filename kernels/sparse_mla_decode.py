"""Sparse-MLA decode on Hopper (sm_90a): one 128-thread CTA per (token, 128-column chunk).

The math and the kernel's shape are in DESIGN.md ("sparse_mla_decode"); the
contract (parameters, variants, shared memory) in runtime/contract/sparse_mla_decode.py.

Per CTA (one warpgroup), for token t and chunk j of its n = width / 128 chunks:

  step 1  sinks -> registers (before griddepcontrol.wait: weights, not produced by the previous grid)
  step 2  griddepcontrol.wait; indices/lens -> per-row gather index (-1 = masked) in smem
  step 3  cp.async gather of Q [16, 512] and KV [128, 512] into 128B-swizzled K-major tiles,
          one async group per 128-byte K block; masked rows are zero-filled without a read
  step 4  S^T = KV Q^T: FP8 WGMMA, two m64 tiles, N 16, K 512, issued per K block as it lands;
          launch_dependents once they are issued
  step 5  chunk softmax per head in base 2 (bmm1_scale * log2 e folded), P^T = 256 exp2(S - m)
          as E4M3 into a 128B-swizzled K-major tile (scaled so that small weights stay normal)
  step 6  (m, l) per head to every CTA of the cluster (st.shared::cluster), cluster arrive
  step 7  O^T = V^T P^T: FP8 WGMMA with V^T from registers (see _v_fragment for the route)
  step 8  cluster wait; merge (m, l) of all chunks and the sink; scale the partial O
  step 9  partial O (FP32) -> staging in the own KV tile; block b of the 512 head dims goes by
          bulk copy to CTA b % n, into its KV tile's second half; cluster barriers order the uses
  step 10 the owner sums the n partials of its block and stores BF16; a last cluster barrier
          keeps every CTA resident until the copies reading its shared memory have landed

Why V^T comes from registers: Hopper's FP8 WGMMA reads shared-memory operands K-major
only, and V (the same tile as K) is stored with the head dims contiguous, i.e. MN-major
for O^T = V^T P^T. The alternatives cost more: a shared-memory transpose writes and
re-reads the 64 KiB tile (and needs a second tile or a serialised pipeline within the
113 KB budget); BF16 for the second product doubles the tile (128 KiB) or its traffic.
With A from registers, one ldmatrix.x4.trans per 16x32 warp fragment plus four byte
permutes build the K-major fragment directly from the swizzled tile (32 ldmatrix and
128 prmt per thread for the whole chunk); the head-dim order inside each fragment is
permuted (lane group g holds dims 2g, 2g+1), which the epilogue undoes for free.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8

from runtime.contract import sparse_mla_decode as contract

from . import ptx
from .compile import cubin_of, gmem_ptr, null_stream

LOG2E = 1.4426950408889634
NEG_BIG = -3.0e38  # finite stand-in for -inf in (max, sum) algebra: keeps 0 * ... free of NaN
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
STATS_OFF = RED_OFF + 2 * 4 * HEADS * 4  # m[5 chunks][16], l[5][16] (f32), written by peers
IDX_OFF = STATS_OFF + 2 * 5 * HEADS * 4  # gather index per row (-1 = masked)
MBAR_OFF = IDX_OFF + ROWS * 4
SMEM_END = MBAR_OFF + 8
# Reduction (after the second MMA): own partial O staged in the KV tile's first half,
# peers' blocks received into its second half.
BLOCK_DIMS = 128
BLOCK_BYTES = HEADS * BLOCK_DIMS * 4  # one 128-dim block of partial O, FP32
STAGE_OFF = KV_OFF
RECV_OFF = KV_OFF + 4 * BLOCK_BYTES
assert SMEM_END + 1023 <= contract.SMEM_BYTES


def _swz(row, chunk16):
    """Byte offset of 16-byte chunk ``chunk16`` of 128-byte row ``row`` in a 128B-swizzled tile."""
    return row * 128 + ((chunk16 ^ (row & 7)) << 4)


class SparseMlaDecodeSm90:
    """Sparse-MLA decode of tokens with up to ``width`` columns; ``has_sinks`` adds the sink term."""

    def __init__(self, width: int, has_sinks: bool, smem_bytes: int):
        assert width % ROWS == 0
        self.n = width // ROWS
        # Reduction ownership: block b of 4 goes to CTA b % n; one receive slot per peer.
        assert self.n == 1 or self.n >= 4, "cluster reduction needs n == 1 or n >= 4"
        assert (self.n - 1) * BLOCK_BYTES <= 4 * KV_KBLOCK - 4 * BLOCK_BYTES
        self.width = width
        self.has_sinks = has_sinks
        self.smem_bytes = smem_bytes

    @cute.jit
    def __call__(self, out: cute.Pointer, q: cute.Pointer, swa_kv: cute.Pointer, ckv: cute.Pointer,
                 indices: cute.Pointer, lens: cute.Pointer, sinks: cute.Pointer, swa_rows: Int32,
                 c_rows: Int32, bmm1_scale: Float32, bmm2_scale: Float32, stream):
        # The runtime sets the grid (T * n CTAs); this one only has to be a multiple of n.
        self.kernel(out, q, swa_kv, ckv, indices, lens, sinks, swa_rows, c_rows, bmm1_scale,
                    bmm2_scale).launch(grid=[self.n, 1, 1], block=[128, 1, 1], cluster=[self.n, 1, 1],
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
        s_idx = base + IDX_OFF
        s_mbar = base + MBAR_OFF

        # Heads of this thread's accumulator columns: slot hs -> 8 (hs >> 1) + 2 t4 + (hs & 1).
        heads = [8 * (hs >> 1) + 2 * t4 + (hs & 1) for hs in range(4)]

        # step 1: sinks (weights of the model, never written by the previous grid).
        sink2 = [Float32(NEG_BIG)] * 4
        if cutlass.const_expr(self.has_sinks):
            sinks_addr = sinks.toint()
            sink2 = [ptx.ld_global_nc_f32(sinks_addr + Int64(h) * 4) * LOG2E for h in heads]
        if cutlass.const_expr(n > 1):
            if tid == 0:
                ptx.mbarrier_init(s_mbar, 1)
                ptx.fence_mbarrier_init_cluster()
            # Phase 0 of the cluster barrier: peers exist and their mbarriers are initialised
            # before anyone stores into their shared memory (waited on in step 6).
            cute.arch.cluster_arrive_relaxed()

        # step 2: everything below reads what the previous grid may have written.
        cute.arch.griddepcontrol_wait()
        col = chunk * ROWS + tid
        tok_len = ptx.ld_global_s32(lens.toint() + Int64(token) * 4)
        idx = ptx.ld_global_s32(indices.toint() + (Int64(token) * self.width + Int64(col)) * 4)
        rows = swa_rows
        pool = swa_kv.toint()
        if cutlass.const_expr(n > 1):
            # Chunk 0 indexes the sliding-window pool, the others the compressed pool.
            is_c = chunk > 0
            rows = Int32(cutlass.select_(is_c, c_rows, swa_rows))
            pool = Int64(cutlass.select_(is_c, ckv.toint(), pool))
        active = (col < tok_len) & (idx >= 0) & (idx < rows)
        ptx.st_shared_s32(s_idx + tid * 4, Int32(cutlass.select_(active, idx, Int32(-1))))
        cute.arch.sync_threads()

        # step 3: gather. Thread tid copies 16-byte chunk tid % 8 of rows tid // 8 + 16 i.
        c16 = tid & 7
        r0 = tid >> 3
        row_idx = [ptx.ld_shared_s32(s_idx + (r0 + 16 * i) * 4) for i in range(8)]
        q_head = tid >> 3
        q_src = q.toint() + Int64(token) * (HEADS * DIM) + Int64(q_head * DIM + c16 * 16)
        for kb in cutlass.range_constexpr(4):
            ptx.cp_async_16(s_q + kb * Q_KBLOCK + _swz(q_head, c16), q_src + kb * 128, 16)
            for i in cutlass.range_constexpr(8):
                r = r0 + 16 * i
                ok = Int32(row_idx[i] >= 0)
                src = pool + Int64(row_idx[i] * ok) * ROW_BYTES + (kb * 128) + Int64(c16 * 16)
                ptx.cp_async_16(s_kv + kb * KV_KBLOCK + _swz(r, c16), src, ok * 16)
            cute.arch.cp_async_commit_group()

        # step 4: S^T[128 rows, 16 heads] = KV x Q^T, one batch of MMAs per landed K block.
        zero8 = [Float32(0.0)] * 8
        acc = [zero8, zero8]
        for kb in cutlass.range_constexpr(4):
            cute.arch.cp_async_wait_group(3 - kb)
            ptx.fence_proxy_async_shared()  # cp.async wrote through the generic proxy
            cute.arch.sync_threads()  # every thread's rows have landed
            ptx.wgmma_fence()
            for ks in cutlass.range_constexpr(4):
                for mt in cutlass.range_constexpr(2):
                    acc[mt] = ptx.wgmma_m64n16k32_e4m3_ss(
                        acc[mt], s_kv + kb * KV_KBLOCK + mt * 64 * 128 + ks * 32,
                        s_q + kb * Q_KBLOCK + ks * 32, int(kb > 0 or ks > 0))
            ptx.wgmma_commit()
        # The score MMAs are issued: the next grid may start its prologue.
        cute.arch.griddepcontrol_launch_dependents()
        flat = ptx.wgmma_wait(0, acc[0] + acc[1])
        acc = [flat[0:8], flat[8:16]]

        # step 5: chunk softmax per head, base 2. Thread rows: 64 mt + 16 warp + g (+8).
        scale2 = bmm1_scale * LOG2E
        row_ok = []
        for mt in cutlass.range_constexpr(2):
            for half in cutlass.range_constexpr(2):
                rr = 64 * mt + 16 * warp + g + 8 * half
                row_ok.append(ptx.ld_shared_s32(s_idx + rr * 4) >= 0)
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
        # P^T[head, row] as E4M3 (x256) into the swizzled K-major tile; rows g and g + 8 of a
        # head share a 16-byte chunk, so one conversion gives both bytes.
        for mt in cutlass.range_constexpr(2):
            for i in (0, 1, 4, 5):
                h = 8 * (i >> 2) + 2 * t4 + (i & 1)
                rr = 64 * mt + 16 * warp + g
                pair = ptx.cvt_e4m3x2(p[mt][i] * 256.0, p[mt][i + 2] * 256.0)
                a = s_p + h * 128 + ((((rr >> 4) ^ (h & 7)) << 4) | (rr & 15))
                ptx.st_shared_u8(a, pair)
                ptx.st_shared_u8(a + 8, pair >> 8)
        ptx.fence_proxy_async_shared()  # P^T is read by WGMMA (async proxy)
        cute.arch.sync_threads()

        # step 6: this chunk's (m, l) per head to every CTA of the cluster.
        if cutlass.const_expr(n > 1):
            cute.arch.cluster_wait()  # phase 0: peers resident, mbarriers initialised
            if tid < HEADS * n:
                h = tid & (HEADS - 1)
                dst = tid >> 4
                mm = Float32(NEG_BIG)
                ll = Float32(0.0)
                for w in cutlass.range_constexpr(4):
                    mm = cute.arch.fmax(mm, ptx.ld_shared_f32(s_red + (w * HEADS + h) * 4))
                    ll = ll + ptx.ld_shared_f32(s_red + ((4 + w) * HEADS + h) * 4)
                ptx.st_cluster_f32(ptx.mapa_shared(s_stats + (chunk * HEADS + h) * 4, dst), mm)
                ptx.st_cluster_f32(ptx.mapa_shared(s_stats + ((5 + chunk) * HEADS + h) * 4, dst), ll)
            cute.arch.cluster_arrive()  # phase 1 (release): stats are out

        # step 7: O^T[512 dims, 16 heads] = V^T x P^T, 8 m64 tiles of head dims, K = 128 rows.
        o = []
        for mt in cutlass.range_constexpr(8):
            # All four K steps' fragments first: wgmma.fence then orders their register writes
            # before the MMAs that read them (one fence per tile instead of one per MMA).
            frags = [self._v_fragment(s_kv, mt, ks, warp, lane) for ks in range(4)]
            frag_acc = zero8
            ptx.wgmma_fence()
            for ks in cutlass.range_constexpr(4):
                frag_acc = ptx.wgmma_m64n16k32_e4m3_rs(frag_acc, frags[ks], s_p + ks * 32, int(ks > 0))
            ptx.wgmma_commit()
            o.append(frag_acc)
        flat = ptx.wgmma_wait(0, [x for frag in o for x in frag])
        o = [flat[8 * mt:8 * mt + 8] for mt in range(8)]

        # step 8: merge the chunks' (m, l) and the sink; scale this chunk's partial O.
        l_c = [Float32(0.0)] * 4
        for hs in cutlass.range_constexpr(4):
            for w in cutlass.range_constexpr(4):
                l_c[hs] = l_c[hs] + ptx.ld_shared_f32(s_red + ((4 + w) * HEADS + heads[hs]) * 4)
        if cutlass.const_expr(n > 1):
            cute.arch.cluster_wait()  # phase 1 (acquire): every chunk's stats have landed
        factor = []
        for hs in cutlass.range_constexpr(4):
            h = heads[hs]
            if cutlass.const_expr(n > 1):
                ms = [ptx.ld_shared_f32(s_stats + (j * HEADS + h) * 4) for j in range(n)]
                ls = [ptx.ld_shared_f32(s_stats + ((5 + j) * HEADS + h) * 4) for j in range(n)]
            else:
                ms = [m_c[hs]]
                ls = [l_c[hs]]
            big_m = sink2[hs]
            for j in cutlass.range_constexpr(n):
                big_m = cute.arch.fmax(big_m, ms[j])
            big_l = Float32(0.0)
            for j in cutlass.range_constexpr(n):
                big_l = big_l + ls[j] * ptx.ex2(ms[j] - big_m)
            if cutlass.const_expr(self.has_sinks):
                big_l = big_l + ptx.ex2(sink2[hs] - big_m)
            # L >= 1 whenever a column is active; an empty token has O = 0, so any finite factor works.
            big_l = cute.arch.fmax(big_l, Float32(1e-30))
            factor.append(bmm2_scale * (1.0 / 256.0) * ptx.ex2(m_c[hs] - big_m) / big_l)

        # step 9: partial O -> staging [block][head][128 dims] FP32 in the own KV tile (its MMAs
        # are done: wgmma_wait above). Thread holds dims 2g, 2g + 1 of each warp's 16-dim group.
        for mt in cutlass.range_constexpr(8):
            blk = mt // 2
            dib = (mt % 2) * 64 + 16 * warp + 2 * g
            for jj in cutlass.range_constexpr(2):
                for cc in cutlass.range_constexpr(2):
                    hs = jj * 2 + cc
                    i0 = 4 * jj + cc  # (dim 2g, head), i0 + 2 = (dim 2g + 1, head)
                    a = s_kv + STAGE_OFF + blk * BLOCK_BYTES + (heads[hs] * BLOCK_DIMS + dib) * 4
                    ptx.st_shared_v2_f32(a, o[mt][i0] * factor[hs], o[mt][i0 + 2] * factor[hs])
        if cutlass.const_expr(n > 1):
            ptx.fence_proxy_async_shared()  # staging is read by bulk copies (async proxy)
            if tid == 0:
                if chunk < 4:
                    ptx.mbarrier_arrive_expect_tx(s_mbar, (n - 1) * BLOCK_BYTES)
            # Phase 2: every CTA's MMAs are done (KV tiles free) and its staging is written.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            if tid == 0:
                for blk in cutlass.range_constexpr(4):
                    owner = blk % n
                    if chunk != owner:
                        slot = chunk - Int32(chunk > owner)
                        dst = ptx.mapa_shared(s_kv + RECV_OFF + slot * BLOCK_BYTES, owner)
                        ptx.bulk_copy_to_peer(dst, s_kv + STAGE_OFF + blk * BLOCK_BYTES, BLOCK_BYTES,
                                              ptx.mapa_shared(s_mbar, owner))
            if chunk < 4:
                ptx.mbarrier_wait_parity(s_mbar, 0)
                self._reduce_store(out, s_kv, token, chunk, tid, n)
            # Phase 3: no CTA exits while a peer's bulk copy may still read its staging.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
            for blk in cutlass.range_constexpr(4):
                self._reduce_store(out, s_kv, token, blk, tid, 1)

    @cute.jit
    def _v_fragment(self, s_kv: Int32, mt: cutlass.Constexpr, ks: cutlass.Constexpr, warp: Int32, lane: Int32):
        """The K-major A fragment of V^T for head-dim tile mt (64 dims) and K step ks (32 rows).

        Warp w covers dims D0 = 64 mt + 16 w .. D0 + 15. ldmatrix.x4.trans reads four 8x8
        b16 matrices whose 8 rows are KV rows {0,1,4,5,8,9,12,13} (+2 for the second,
        +16 / +18 for the third / fourth) of the K step; lane (g, t) then holds KV rows
        4t, 4t+1 (resp. 4t+2, 4t+3) x dims 2g, 2g+1, and two byte permutes give the
        fragment's rows: M slot g = dim D0 + 2g and M slot g + 8 = dim D0 + 2g + 1.
        """
        mi = lane >> 3
        i = lane & 7
        kr = 32 * ks + 16 * (mi >> 1) + 2 * (mi & 1) + 4 * (i >> 1) + (i & 1)
        kb = mt // 2
        c16 = (mt % 2) * 4 + warp
        x = ptx.ldmatrix_x4_trans(s_kv + kb * KV_KBLOCK + _swz(kr, c16))
        return [ptx.prmt(x[0], x[1], 0x6420), ptx.prmt(x[0], x[1], 0x7531),
                ptx.prmt(x[2], x[3], 0x6420), ptx.prmt(x[2], x[3], 0x7531)]

    @cute.jit
    def _reduce_store(self, out: cute.Pointer, s_kv: Int32, token: Int32, blk: Int32, tid: Int32,
                      n: cutlass.Constexpr):
        """Sum the n partials of 128-dim block ``blk`` (own staging + received) and store BF16.

        Thread tid takes head tid // 8 and 16 consecutive dims (tid % 8) * 16.
        """
        h = tid >> 3
        d0 = (tid & 7) * 16
        acc = [Float32(0.0)] * 16
        srcs = [s_kv + STAGE_OFF + blk * BLOCK_BYTES]
        for sl in cutlass.range_constexpr(n - 1):
            srcs.append(s_kv + RECV_OFF + sl * BLOCK_BYTES)
        for src in srcs:
            for k in cutlass.range_constexpr(4):
                v = ptx.ld_shared_v4_f32(src + (h * BLOCK_DIMS + d0 + 4 * k) * 4)
                for e in cutlass.range_constexpr(4):
                    acc[4 * k + e] = acc[4 * k + e] + v[e]
        words = [ptx.cvt_bf16x2(acc[2 * e], acc[2 * e + 1]) for e in range(8)]
        dst = out.toint() + (Int64(token) * HEADS + Int64(h)) * (DIM * 2) + Int64((blk * BLOCK_DIMS + d0) * 2)
        ptx.st_global_v4_b32(dst, words[0], words[1], words[2], words[3])
        ptx.st_global_v4_b32(dst + 16, words[4], words[5], words[6], words[7])


def compile_variant(variant, arch: str) -> bytes:
    op = SparseMlaDecodeSm90(variant.option("width"), variant.option("has_sinks"), variant.smem_bytes)
    ptrs = [gmem_ptr(cutlass.Uint8) for _ in range(7)]
    return cubin_of(op, *ptrs, Int32(0), Int32(0), Float32(1.0), Float32(1.0), null_stream(), arch=arch)
