"""Inline-PTX helpers shared by every kernel family (one module, no copies elsewhere).

CuTe DSL 4.8.1 wraps most of what the kernels need (barriers, shuffles,
griddepcontrol, cp.async groups); these helpers cover the rest: memory operations
on raw 32-bit shared-memory addresses (swizzled tiles are addressed by hand, and
the mbarriers too, where CuTe's wrappers take its pointers), Hopper WGMMA with
explicit descriptors and register fragments, ldmatrix, DSMEM stores and bulk
copies between CTAs of a cluster, and a few conversions.

Every helper is ``has_side_effects=True`` unless noted: memory operations must
keep their order relative to barriers, fences and ``griddepcontrol.wait``. Only
register-to-register ones are ``pure``; the read-only (``.nc``) loads are not
either: a pure load could be moved above the dependency wait, reading a
predecessor's output before it is written. That order binds LLVM only: ptxas
may still schedule an ``.nc`` load below the wait, next to its first use: a load
that must stay above it needs a use above it too (sparse_mla_decode's step 1).
Shared-memory addresses are ``Int32`` (the ``.shared::cta`` window); global
addresses are ``Int64``.
"""

from __future__ import annotations

from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _asm(results, operands, text, constraints, pure=False):
    """One inline-asm statement; ``results`` is None, one MLIR type or a list of them."""
    if isinstance(results, list):
        res = llvm.StructType.get_literal(results)
    else:
        res = results
    return llvm.inline_asm(
        res,
        operands,
        text,
        constraints,
        has_side_effects=not pure,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def _unpack(struct, types):
    return [llvm.extractvalue(t, struct, [i]) for i, t in enumerate(types)]


def _i32(x):
    return Int32(x).ir_value()


def _i64(x):
    return Int64(x).ir_value()


def _f32(x):
    return Float32(x).ir_value()


# ---------------------------------------------------------------- global memory


@dsl_user_op
def ld_global_s32(addr: Int64, *, loc=None, ip=None) -> Int32:
    """An int32 from global memory that an earlier grid may have written (coherent, ordered)."""
    return Int32(_asm(T.i32(), [_i64(addr)], "ld.global.s32 $0, [$1];", "=r,l"))


@dsl_user_op
def ld_global_nc_f32(addr: Int64, *, loc=None, ip=None) -> Float32:
    """A float from read-only global memory (weights: safe before griddepcontrol.wait)."""
    return Float32(_asm(T.f32(), [_i64(addr)], "ld.global.nc.f32 $0, [$1];", "=f,l"))


@dsl_user_op
def st_global_v4_b32(addr: Int64, a, b, c, d, *, loc=None, ip=None) -> None:
    """Store four 32-bit words at a 16-byte aligned global address."""
    _asm(None, [_i64(addr), _i32(a), _i32(b), _i32(c), _i32(d)],
         "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r")


@dsl_user_op
def st_global_b32(addr: Int64, a, *, loc=None, ip=None) -> None:
    _asm(None, [_i64(addr), _i32(a)], "st.global.b32 [$0], $1;", "l,r")


@dsl_user_op
def cp_async_16(smem: Int32, gmem: Int64, src_bytes: Int32, *, loc=None, ip=None) -> None:
    """cp.async of 16 bytes global -> shared; src_bytes < 16 zero-fills the rest.

    With src_bytes == 0 nothing is read from global memory (a masked row costs no
    traffic and cannot fault), yet the copy stays in the thread's async group.
    """
    _asm(None, [_i32(smem), _i64(gmem), _i32(src_bytes)],
         "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r")


# ---------------------------------------------------------------- shared memory


@dsl_user_op
def ld_shared_s32(addr: Int32, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_i32(addr)], "ld.shared.s32 $0, [$1];", "=r,r"))


@dsl_user_op
def ld_shared_f32(addr: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [_i32(addr)], "ld.shared.f32 $0, [$1];", "=f,r"))


@dsl_user_op
def st_shared_f32(addr: Int32, v, *, loc=None, ip=None) -> None:
    _asm(None, [_i32(addr), _f32(v)], "st.shared.f32 [$0], $1;", "r,f")


@dsl_user_op
def st_shared_u16(addr: Int32, v, *, loc=None, ip=None) -> None:
    """Store the low half-word of v."""
    _asm(None, [_i32(addr), _i32(v)], "{\n.reg .b16 h;\ncvt.u16.u32 h, $1;\nst.shared.u16 [$0], h;\n}", "r,r")


@dsl_user_op
def ld_shared_u16(addr: Int32, *, loc=None, ip=None) -> Uint32:
    """A half-word of shared::cta memory, zero-extended."""
    return Uint32(_asm(T.i32(), [_i32(addr)], "{\n.reg .b16 h;\nld.shared.u16 h, [$1];\ncvt.u32.u16 $0, h;\n}",
                       "=r,r"))


@dsl_user_op
def st_shared_v4_b32(addr: Int32, a, b, c, d, *, loc=None, ip=None) -> None:
    """Store four 32-bit words at a 16-byte aligned shared::cta address, one request."""
    _asm(None, [_i32(addr), _i32(a), _i32(b), _i32(c), _i32(d)],
         "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r")


@dsl_user_op
def st_shared_b32(addr: Int32, v, *, loc=None, ip=None) -> None:
    _asm(None, [_i32(addr), _i32(v)], "st.shared.b32 [$0], $1;", "r,r")


@dsl_user_op
def split_by_bin(out_addr: Int64, list_addr: Int32, idx_delta: Int32, key, idx, hi, lo, to_cluster: bool = False,
                 mbar=None, *, loc=None, ip=None):
    """One item of a threshold split, branch-free: key >= hi stores idx at out_addr (global); lo <= key < hi
    stores key at list_addr and idx at list_addr + idx_delta (shared::cta, or with to_cluster a shared::cluster
    address from mapa_shared; with mbar as well, by st.async completing 4 bytes a word on the mbarrier at mbar,
    shared::cluster too). Returns (out_addr, list_addr), each advanced by 4 bytes where it took the item. Keys and
    bounds compare unsigned."""
    if mbar is None:
        store = "st.shared::cluster.b32 [{}], {};" if to_cluster else "st.shared.b32 [{}], {};"
        operands, cons = [], ""
    else:
        store = "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [{}], {}, [$9];"
        operands, cons = [_i32(mbar)], ",r"
    st = _asm([T.i64(), T.i32()],
              [_i64(out_addr), _i32(list_addr), _i32(idx_delta), Uint32(key).ir_value(), _i32(idx),
               Uint32(hi).ir_value(), Uint32(lo).ir_value()] + operands,
              "{\n.reg .pred p, q;\n.reg .b32 t;\n.reg .b64 d;\n"
              "setp.ge.u32 p, $5, $7;\n"
              "setp.ge.and.u32 q, $5, $8, !p;\n"
              "@p st.global.b32 [$2], $6;\n"
              "@q " + store.format("$3", "$5") + "\n"
              "add.u32 t, $3, $4;\n"
              "@q " + store.format("t", "$6") + "\n"
              "selp.b64 d, 4, 0, p;\n"
              "add.s64 $0, $2, d;\n"
              "selp.b32 t, 4, 0, q;\n"
              "add.u32 $1, $3, t;\n}",
              "=l,=r,l,r,r,r,r,r,r" + cons)
    a, b = _unpack(st, [T.i64(), T.i32()])
    return Int64(a), Int32(b)


@dsl_user_op
def ld_shared_v2_b32(addr: Int32, *, loc=None, ip=None):
    """Two 32-bit words from an 8-byte aligned shared address."""
    ts = [T.i32()] * 2
    s = _asm(ts, [_i32(addr)], "ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r")
    return [Int32(v) for v in _unpack(s, ts)]


@dsl_user_op
def ldmatrix_x4_trans(addr: Int32, *, loc=None, ip=None):
    """ldmatrix .x4 .trans of b16 8x8 matrices; lane l gives the row address l % 8 of matrix l // 8.

    Thread l receives, per matrix, the b16 elements at rows 2(l%4) (low half) and
    2(l%4)+1 (high half) of column l // 4.
    """
    ts = [T.i32()] * 4
    s = _asm(ts, [_i32(addr)],
             "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];",
             "=r,=r,=r,=r,r")
    return [Int32(v) for v in _unpack(s, ts)]


@dsl_user_op
def fence_proxy_async_shared(*, loc=None, ip=None) -> None:
    """Make this thread's generic-proxy shared writes visible to the async proxy (WGMMA, bulk copy)."""
    _asm(None, [], "fence.proxy.async.shared::cta;", "")


# ---------------------------------------------------------------- cluster / DSMEM


@dsl_user_op
def mapa_shared(addr: Int32, rank, *, loc=None, ip=None) -> Int32:
    """The shared::cluster address of ``addr`` in the CTA of cluster rank ``rank``."""
    return Int32(_asm(T.i32(), [_i32(addr), _i32(rank)], "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r"))


@dsl_user_op
def st_cluster_b32(addr: Int32, v, *, loc=None, ip=None) -> None:
    """Store a 32-bit word at a shared::cluster address (from mapa_shared)."""
    _asm(None, [_i32(addr), Uint32(v).ir_value()], "st.shared::cluster.b32 [$0], $1;", "r,r")


@dsl_user_op
def st_async_v2_f32(addr: Int32, a, b, mbar: Int32, *, loc=None, ip=None) -> None:
    """Two floats to a peer's shared memory (shared::cluster addresses), completing 8 bytes on its mbarrier."""
    _asm(None, [_i32(addr), _f32(a), _f32(b), _i32(mbar)],
         "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [$0], {$1, $2}, [$3];", "r,f,f,r")


@dsl_user_op
def st_async_b32(addr: Int32, v, mbar: Int32, *, loc=None, ip=None) -> None:
    """A 32-bit word to a (peer's) shared::cluster address, completing 4 bytes on the mbarrier at mbar (shared::cluster
    as well): what a release would publish, without its GPU-scope membar."""
    _asm(None, [_i32(addr), Uint32(v).ir_value(), _i32(mbar)],
         "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [$0], $1, [$2];", "r,r,r")


@dsl_user_op
def mbarrier_arrive_expect_tx_cluster(addr: Int32, nbytes, *, loc=None, ip=None) -> None:
    """One relaxed arrival on the mbarrier at a (peer's) shared::cluster address, raising its phase's transaction
    count by nbytes first (bytes that come by st.async): no release, so no GPU-scope membar in SASS."""
    _asm(None, [_i32(addr), _i32(nbytes)],
         "mbarrier.arrive.expect_tx.relaxed.cluster.shared::cluster.b64 _, [$0], $1;", "r,r")


@dsl_user_op
def fence_release_shared_cta_cluster(*, loc=None, ip=None) -> None:
    """Release, at cluster scope, this thread's earlier operations on its own CTA's shared memory only (what the
    peers then read through distributed shared memory after a relaxed cluster arrive and their acquiring wait).
    Unlike a plain cluster-scope release (fence.acq_rel.cluster, barrier.cluster.arrive's default), which is a
    MEMBAR.ALL.GPU in SASS on sm_90, this is a CTA-level MEMBAR: it does not order global or peer memory."""
    _asm(None, [], "fence.release.sync_restrict::shared::cta.cluster;", "")


@dsl_user_op
def mbarrier_init(addr: Int32, count, *, loc=None, ip=None) -> None:
    _asm(None, [_i32(addr), _i32(count)], "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r")


@dsl_user_op
def fence_mbarrier_init_cluster(*, loc=None, ip=None) -> None:
    """Publish mbarrier.init to the cluster (peers complete transactions on it)."""
    _asm(None, [], "fence.mbarrier_init.release.cluster;", "")


@dsl_user_op
def mbarrier_arrive_expect_tx(addr: Int32, nbytes, *, loc=None, ip=None) -> None:
    _asm(None, [_i32(addr), _i32(nbytes)],
         "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r")


@dsl_user_op
def mbarrier_arrive(addr: Int32, *, loc=None, ip=None) -> None:
    """One arrival on a CTA-local mbarrier (release: this thread's earlier shared reads are done)."""
    _asm(None, [_i32(addr)], "mbarrier.arrive.shared::cta.b64 _, [$0];", "r")


@dsl_user_op
def mbarrier_inval(addr: Int32, *, loc=None, ip=None) -> None:
    """End an mbarrier's life, so its 8 bytes may hold ordinary data again."""
    _asm(None, [_i32(addr)], "mbarrier.inval.shared::cta.b64 [$0];", "r")


@dsl_user_op
def mbarrier_wait_parity(addr: Int32, parity, cluster: bool = True, *, loc=None, ip=None) -> None:
    """Spin until the mbarrier's phase with this parity has completed (acquire at cluster scope, for what peers
    wrote; cluster=False: CTA scope, enough for this CTA's threads and its own bulk copies, and no L1 invalidation
    (CCTL.IVALL) at every wait)."""
    scope = "cluster" if cluster else "cta"
    _asm(None, [_i32(addr), _i32(parity)],
         "{\n.reg .pred p;\nLAB_WAIT:\n"
         f"mbarrier.try_wait.parity.acquire.{scope}.shared::cta.b64 p, [$0], $1;\n"
         "@!p bra LAB_WAIT;\n}", "r,r")


@dsl_user_op
def bulk_copy_to_peer(dst_cluster: Int32, src: Int32, nbytes, mbar_cluster: Int32, *, loc=None, ip=None) -> None:
    """Bulk-copy nbytes of this CTA's shared memory to a peer's, completing on the peer's mbarrier."""
    _asm(None, [_i32(dst_cluster), _i32(src), _i32(nbytes), _i32(mbar_cluster)],
         "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
         "r,r,r,r")


@dsl_user_op
def bulk_copy_global_to_shared(dst: Int32, src: Int64, nbytes, mbar: Int32, evict_first: bool = False, *, loc=None,
                               ip=None) -> None:
    """Bulk-copy nbytes (a multiple of 16) of global memory at a 16-byte aligned address into this CTA's shared
    memory (16-byte aligned), completing nbytes of transactions on the mbarrier at mbar (sm_90+). evict_first: the
    lines read get an L2 evict-first policy (data read once)."""
    copy = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
    if evict_first:
        text = ("{\n.reg .b64 policy;\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
                f"{copy}.L2::cache_hint [$0], [$1], $2, [$3], policy;\n}}")
    else:
        text = f"{copy} [$0], [$1], $2, [$3];"
    _asm(None, [_i32(dst), _i64(src), _i32(nbytes), _i32(mbar)], text, "r,l,r,r")


# ---------------------------------------------------------------- WGMMA (sm_90a)


def _desc_lo(addr):
    """Low word of a K-major 128B-swizzle descriptor: start address >> 4, LBO = 1 (unused)."""
    return ((Int32(addr) >> 4) & 0x3FFF) | (1 << 16)


# High word: SBO = 1024 bytes (eight 128-byte rows), layout type 1 = 128B swizzle (bit 62).
_DESC_HI_SW128 = (1024 >> 4) | (1 << 30)


@dsl_user_op
def wgmma_fence(*, loc=None, ip=None) -> None:
    _asm(None, [], "wgmma.fence.sync.aligned;", "")


@dsl_user_op
def wgmma_commit(*, loc=None, ip=None) -> None:
    _asm(None, [], "wgmma.commit_group.sync.aligned;", "")


@dsl_user_op
def wgmma_wait(pending: int, acc, *, loc=None, ip=None):
    """wgmma.wait_group ``pending``, threading the accumulators through the asm.

    Returning the registers as outputs ties every later use of them to the wait,
    so the compiler cannot read an accumulator before its MMA has landed.
    """
    n = len(acc)
    ts = [T.f32()] * n
    cons = ",".join(["=f"] * n + [str(i) for i in range(n)])
    s = _asm(ts, [_f32(a) for a in acc], f"wgmma.wait_group.sync.aligned {pending};", cons)
    return [Float32(v) for v in _unpack(s, ts)]


@dsl_user_op
def wgmma_m64n16k32_e4m3_ss(acc, a_addr: Int32, b_addr: Int32, accumulate: int, *, loc=None, ip=None):
    """D[64x16] (+)= A[64x32] B[32x16]^T, FP8 E4M3 -> FP32; both from 128B-swizzled K-major smem.

    acc: 8 floats (the m64n16 accumulator fragment); a_addr/b_addr: shared
    addresses of the operands' first byte (inside a 1024-byte aligned swizzle atom
    row 0, offset along K by multiples of 32 bytes).
    """
    ts = [T.f32()] * 8
    cons = ",".join(["=f"] * 8 + [str(i) for i in range(8)] + ["r", "r", "r", "n"])
    text = (
        "{\n.reg .b64 da, db;\n"
        "mov.b64 da, {$16, $18};\nmov.b64 db, {$17, $18};\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{$0, $1, $2, $3, $4, $5, $6, $7}, da, db, $19, 1, 1;\n}"
    )
    s = _asm(ts, [_f32(a) for a in acc] + [_i32(_desc_lo(a_addr)), _i32(_desc_lo(b_addr)),
                                            _i32(_DESC_HI_SW128), _i32(1 if accumulate else 0)], text, cons)
    return [Float32(v) for v in _unpack(s, ts)]


@dsl_user_op
def wgmma_m64n16k32_e4m3_rs(acc, a_frag, b_addr: Int32, accumulate: int, *, loc=None, ip=None):
    """D[64x16] (+)= A[64x32] B[32x16]^T, FP8 E4M3; A from registers, B K-major 128B-swizzled smem.

    a_frag: 4 words per thread in the m16n8k32 A layout of each warp's 16 rows
    (a0: row g, k 4t..4t+3; a1: row g+8; a2, a3: k + 16), g = lane/4, t = lane%4.
    """
    ts = [T.f32()] * 8
    cons = ",".join(["=f"] * 8 + [str(i) for i in range(8)] + ["r"] * 4 + ["r", "r", "n"])
    text = (
        "{\n.reg .b64 db;\n"
        "mov.b64 db, {$20, $21};\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{$0, $1, $2, $3, $4, $5, $6, $7}, {$16, $17, $18, $19}, db, $22, 1, 1;\n}"
    )
    s = _asm(ts, [_f32(a) for a in acc] + [_i32(x) for x in a_frag]
             + [_i32(_desc_lo(b_addr)), _i32(_DESC_HI_SW128), _i32(1 if accumulate else 0)], text, cons)
    return [Float32(v) for v in _unpack(s, ts)]


# ---------------------------------------------------------------- timers


@dsl_user_op
def clock32(*, loc=None, ip=None) -> Int32:
    """The SM's cycle counter (low 32 bits), in program order."""
    return Int32(_asm(T.i32(), [], "mov.u32 $0, %clock;", "=r"))


@dsl_user_op
def globaltimer_lo(*, loc=None, ip=None) -> Int32:
    """Low 32 bits of the global nanosecond timer."""
    return Int32(_asm(T.i32(), [], "mov.u32 $0, %globaltimer_lo;", "=r"))


# ---------------------------------------------------------------- math / conversion


@dsl_user_op
def ex2(x, *, loc=None, ip=None) -> Float32:
    """2^x (ex2.approx.ftz: -inf -> +0)."""
    return Float32(_asm(T.f32(), [_f32(x)], "ex2.approx.ftz.f32 $0, $1;", "=f,f", pure=True))


@dsl_user_op
def cvt_e4m3x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Two floats as E4M3 bytes (round to nearest, saturating): lo in byte 0, hi in byte 1."""
    return Int32(_asm(T.i32(), [_f32(lo), _f32(hi)],
                      "{\n.reg .b16 h;\ncvt.rn.satfinite.e4m3x2.f32 h, $2, $1;\ncvt.u32.u16 $0, h;\n}",
                      "=r,f,f", pure=True))


@dsl_user_op
def cvt_bf16x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Two floats as BF16 (round to nearest) packed in a word, lo in the low half."""
    return Int32(_asm(T.i32(), [_f32(lo), _f32(hi)], "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", pure=True))


@dsl_user_op
def max_bf16x2(a, b, *, loc=None, ip=None) -> Uint32:
    """Halfwise maximum of two words of two BF16 values each (a NaN half loses to a number)."""
    return Uint32(_asm(T.i32(), [_i32(a), _i32(b)], "max.bf16x2 $0, $1, $2;", "=r,r,r", pure=True))


def _any_zero_or_nan(words, kind, lanes):
    """1 if any of `lanes` values in `words` (kind: the setp type) is +-0 or NaN (setp.equ against 0), else 0."""
    preds = [f"p{i}" for i in range(lanes)]
    per = lanes // len(words)
    lines = [f".reg .pred {', '.join(preds)};", ".reg .b32 z;", "mov.b32 z, 0;"]
    for w in range(len(words)):
        dst = "|".join(preds[w * per:(w + 1) * per])
        lines.append(f"setp.equ.{kind} {dst}, ${w + 1}, z;")
    live = preds
    while len(live) > 1:
        lines += [f"or.pred {live[i]}, {live[i]}, {live[i + 1]};" for i in range(0, len(live), 2)]
        live = live[::2]
    lines.append(f"selp.u32 $0, 1, 0, {live[0]};")
    return Int32(_asm(T.i32(), [_i32(w) for w in words], "{\n" + "\n".join(lines) + "\n}",
                      "=r" + ",r" * len(words), pure=True))


@dsl_user_op
def any_zero_or_nan_bf16x2(w0, w1, w2, w3, *, loc=None, ip=None) -> Int32:
    """1 if any of the eight BF16 values in four words (two a word) is +-0 or NaN, else 0."""
    return _any_zero_or_nan([w0, w1, w2, w3], "bf16x2", 8)


@dsl_user_op
def any_zero_or_nan_f32(w0, w1, w2, w3, w4, w5, w6, w7, *, loc=None, ip=None) -> Int32:
    """1 if any of eight floats (given by their bits) is +-0 or NaN, else 0."""
    return _any_zero_or_nan([w0, w1, w2, w3, w4, w5, w6, w7], "f32", 8)


@dsl_user_op
def max_f32_bits(a, b, *, loc=None, ip=None) -> Uint32:
    """The bits of the larger of two floats given by their bits (a NaN loses to a number)."""
    return Uint32(_asm(T.i32(), [_i32(a), _i32(b)],
                       "{\n.reg .f32 x, y;\nmov.b32 x, $1;\nmov.b32 y, $2;\nmax.f32 x, x, y;\nmov.b32 $0, x;\n}",
                       "=r,r,r", pure=True))


@dsl_user_op
def cvt_f16x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Two floats as FP16 (round to nearest) packed in a word, lo in the low half."""
    return Int32(_asm(T.i32(), [_f32(lo), _f32(hi)], "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", pure=True))


@dsl_user_op
def unpack_f16x2(w, *, loc=None, ip=None):
    """The two FP16 halves of a word as floats, low half first."""
    ts = [T.f32()] * 2
    s = _asm(ts, [_i32(w)], "{\n.reg .b16 l, h;\nmov.b32 {l, h}, $2;\ncvt.f32.f16 $0, l;\ncvt.f32.f16 $1, h;\n}",
             "=f,=f,r", pure=True)
    return [Float32(v) for v in _unpack(s, ts)]


@dsl_user_op
def prmt(a, b, selector: int, *, loc=None, ip=None) -> Int32:
    """Byte permute of the pair {b, a} (a = bytes 0-3) by a constant selector."""
    return Int32(_asm(T.i32(), [_i32(a), _i32(b)], f"prmt.b32 $0, $1, $2, {selector:#x};", "=r,r,r", pure=True))


# ---------------------------------------------------------------- unsigned words (radix select)
# Unsigned 32-bit results: the keys of an order-preserving float -> integer map.


@dsl_user_op
def ld_global_nc_v4_u32(addr: Int64, *, loc=None, ip=None):
    """Four words (16-byte aligned) of read-only global data, not kept in L1 (read once)."""
    st = _asm([T.i32()] * 4, [_i64(addr)],
              "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
    return tuple(Uint32(v) for v in _unpack(st, [T.i32()] * 4))


@dsl_user_op
def prefetch_l2_bulk(addr: Int64, nbytes, *, loc=None, ip=None) -> None:
    """Ask L2 for nbytes (a multiple of 16) of global memory at a 16-byte aligned address.

    One instruction of one thread, no registers and no completion: the later loads of
    those bytes hit L2 instead of waiting on DRAM (sm_90+).
    """
    _asm(None, [_i64(addr), _i32(nbytes)], "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r")


@dsl_user_op
def ld_global_nc_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """One word of read-only global data."""
    return Uint32(_asm(T.i32(), [_i64(addr)], "ld.global.nc.u32 $0, [$1];", "=r,l"))


@dsl_user_op
def ld_global_nc_u16(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """One half-word of read-only global data, zero-extended."""
    return Uint32(_asm(T.i32(), [_i64(addr)],
                       "{\n.reg .b16 h;\nld.global.nc.u16 h, [$1];\ncvt.u32.u16 $0, h;\n}", "=r,l"))


@dsl_user_op
def ld_shared_v4_u32(addr: Int32, *, loc=None, ip=None):
    """Four words from a 16-byte aligned shared::cta address, one request."""
    st = _asm([T.i32()] * 4, [_i32(addr)], "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r")
    return tuple(Uint32(v) for v in _unpack(st, [T.i32()] * 4))


@dsl_user_op
def f32_geu(a_bits, b_bits, *, loc=None, ip=None) -> Int32:
    """1 if the float with bits a_bits is >= the one with bits b_bits or either is NaN (setp.geu), else 0."""
    return Int32(_asm(T.i32(), [Uint32(a_bits).ir_value(), Uint32(b_bits).ir_value()],
                      "{\n.reg .pred p;\nsetp.geu.f32 p, $1, $2;\nselp.s32 $0, 1, 0, p;\n}", "=r,r,r", pure=True))


@dsl_user_op
def ld_cluster_u32(addr: Int32, *, loc=None, ip=None) -> Uint32:
    """A word at a shared::cluster address (from mapa_shared); order it with a cluster barrier."""
    return Uint32(_asm(T.i32(), [_i32(addr)], "ld.shared::cluster.u32 $0, [$1];", "=r,r"))


@dsl_user_op
def ld_cluster_v4_u32(addr: Int32, *, loc=None, ip=None):
    """Four words (16-byte aligned) at a shared::cluster address, one request."""
    st = _asm([T.i32()] * 4, [_i32(addr)], "ld.shared::cluster.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r")
    return tuple(Uint32(v) for v in _unpack(st, [T.i32()] * 4))


@dsl_user_op
def red_shared_max_s32(addr: Int32, v, *, loc=None, ip=None) -> None:
    """A signed max into the word at a shared address (no return value)."""
    _asm(None, [_i32(addr), _i32(v)], "red.shared.max.s32 [$0], $1;", "r,r")


@dsl_user_op
def red_shared_add_if(addr: Int32, v, pred, *, loc=None, ip=None) -> None:
    """Add v at a shared address where pred (an Int32) is nonzero: one predicated reduction, no branch (the
    address may be anything where it is zero)."""
    _asm(None, [_i32(addr), _i32(v), _i32(pred)],
         "{\n.reg .pred p;\nsetp.ne.u32 p, $2, 0;\n@p red.shared.add.u32 [$0], $1;\n}", "r,r,r")


@dsl_user_op
def atom_add_cluster_u32(addr: Int32, v, *, loc=None, ip=None) -> Uint32:
    """Atomic add at a shared::cluster address (any CTA of the cluster); returns the old value."""
    return Uint32(_asm(T.i32(), [_i32(addr), Uint32(v).ir_value()],
                       "atom.shared::cluster.add.u32 $0, [$1], $2;", "=r,r,r"))


@dsl_user_op
def exit_thread(*, loc=None, ip=None) -> None:
    """End this thread (timing experiments that stop a kernel after a phase)."""
    _asm(None, [], "exit;", "")
