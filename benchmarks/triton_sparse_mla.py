"""A Triton split-KV sparse-MLA decode: the benchmark's hand-written peer of the CuTe DSL kernel.

Same operation as ``runtime.reference.sparse_mla_decode_reference`` (read its docstring). Two
launches:

1. ``_split_kernel``, grid ``(T, splits)``: a program takes one token and ``tiles`` consecutive
   tiles of ``block_n`` columns of its sparse set; it gathers the tile's FP8 rows (masked columns
   load nothing and score -inf), computes the 16 heads' scores with an FP8 dot, and keeps an
   online softmax in base 2. It writes its unnormalised partial output and its per-head
   ``(max, sum)`` in FP32.
2. ``_combine_kernel``, grid ``(T, 16)``: merges a token's partials and the sink, scales by
   ``bmm2_scale`` and stores BF16; a token without active columns gets zeros.

Splitting the columns of each token over several programs is what makes a batch of a few tokens
use the GPU at all; ``CONFIGS`` lists the shapes the benchmark sweeps to pick the best per case.
Not part of the runtime: benchmarks and GPU tests only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

HEADS, HEAD_DIM, SWA_COLUMNS = 16, 512, 128
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Config:
    block_n: int = 64  # columns per tile (divides 128, so a tile lies in one pool)
    tiles: int = 1  # tiles per program (a split covers block_n * tiles columns)
    num_warps: int = 4
    num_stages: int = 2
    fp8_pv: bool = False  # second product in FP8 (P scaled by 256 into E4M3) instead of FP16
    kv_major: bool = False  # products as S^T = KV Q^T, O^T = V^T P^T (tile rows as the MMA's M)
    pdl: bool = True  # programmatic dependent launch between the two kernels (and the previous op)
    # Partials stored as FP16 O / l (|O / l| <= max |kv| <= 448) instead of FP32 O: half the bytes written and read
    # back, as the CuTe kernel's cluster partials; the combine weighs them by l 2^(m - M).
    fp16_partials: bool = False

    def splits(self, width: int) -> int:
        return triton.cdiv(width, self.block_n * self.tiles)


# The shapes swept by the benchmark: (block_n, tiles, num_stages, num_warps) per orientation, kept
# to those whose sm_90a build spills no registers (checked with cuobjdump --dump-resource-usage on
# triton.compile output for GPUTarget("cuda", 90, 32)), each with P in FP16 and in FP8.
_HEADS_MAJOR = ((32, 1, 2, 4), (32, 1, 2, 8), (32, 2, 2, 8), (32, 4, 3, 8), (64, 1, 2, 8),
                (16, 1, 2, 4), (16, 2, 2, 4), (32, 1, 2, 2))
# (64, 1, 2, 8) KV-major is left out: with P in FP16 it wrote NaN for some (token, head) pairs on the
# H200 under Triton 3.6 (tests/test_sparse_mla_gpu.py, round 3), though its FP8-P twin was right.
_KV_MAJOR = ((32, 1, 2, 4), (32, 1, 2, 8), (32, 2, 2, 8), (32, 4, 2, 8), (32, 4, 3, 4),
             (64, 2, 2, 8), (64, 4, 2, 8), (16, 1, 2, 4), (16, 2, 2, 4), (32, 1, 2, 2))
# The last three of each (thirty-fifth session): the previous sweeps' winner sat at their edge (block_n 32,
# one tile), so smaller blocks and fewer warps are swept too; not checked for spills (a spilling config is
# only slower, and the benchmark times the fastest whose output matches the reference).
CONFIGS = tuple(
    Config(block_n=b, tiles=t, num_stages=s, num_warps=w, fp8_pv=f, kv_major=k)
    for k, shapes in ((False, _HEADS_MAJOR), (True, _KV_MAJOR))
    for (b, t, s, w) in shapes
    for f in (False, True)
    if b >= 32 or not f  # an FP8 dot needs K >= 32: block_n 16 keeps P in FP16 (Triton 3.6 refuses to compile it)
) + tuple(
    # FP16 partials (thirty-fifth session's review: the FP32 ones double the bytes) on the shapes that won a case.
    Config(block_n=b, tiles=t, num_stages=s, num_warps=w, kv_major=k, fp16_partials=True)
    for k in (False, True)
    for (b, t, s, w) in ((16, 1, 2, 4), (32, 1, 2, 4), (32, 1, 2, 8), (32, 4, 3, 4) if k else (32, 4, 3, 8))
)
DEFAULT = Config(block_n=32, tiles=1, num_warps=8, kv_major=True)
# A short sweep for rounds with little device time.
QUICK_CONFIGS = tuple(c for c in CONFIGS if (c.block_n, c.tiles, c.num_warps) in ((32, 1, 8), (32, 2, 8), (64, 1, 8))
                      and (c.kv_major or not c.fp8_pv))


@triton.jit
def _split_kernel(q_ptr, swa_ptr, comp_ptr, idx_ptr, lens_ptr, part_o_ptr, part_ml_ptr,
                  swa_rows, comp_rows, width, qk_scale,
                  HEADS: tl.constexpr, D: tl.constexpr, SWA: tl.constexpr,
                  BLOCK_N: tl.constexpr, TILES: tl.constexpr, FP8_PV: tl.constexpr, KV_MAJOR: tl.constexpr,
                  PDL: tl.constexpr, STAGES: tl.constexpr, PARTIAL_F16: tl.constexpr):
    t = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    t64 = t.to(tl.int64)
    rh = tl.arange(0, HEADS)
    rd = tl.arange(0, D)
    if PDL:
        # Inputs may come from the previous kernel, and the partials it may still read are
        # overwritten below: wait for it, then let the combine launch early.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    q = tl.load(q_ptr + t64 * HEADS * D + rh[:, None] * D + rd[None, :])  # [16, 512] FP8
    n_valid = tl.minimum(tl.load(lens_ptr + t), width)

    m = tl.full([HEADS], float("-inf"), tl.float32)
    l = tl.zeros([HEADS], tl.float32)
    if KV_MAJOR:
        acc = tl.zeros([D, HEADS], tl.float32)  # O^T
    else:
        acc = tl.zeros([HEADS, D], tl.float32)
    for i in tl.range(0, TILES, num_stages=STAGES):
        cols = (split * TILES + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + t64 * width + cols, mask=cols < n_valid, other=-1).to(tl.int64)
        in_swa = cols < SWA
        rows = tl.where(in_swa, swa_rows, comp_rows)
        active = (idx >= 0) & (idx < rows)
        safe = tl.where(active, idx, 0)
        row_ptr = tl.where(in_swa, swa_ptr + safe * D, comp_ptr + safe * D)
        kv = tl.load(row_ptr[:, None] + rd[None, :], mask=active[:, None], other=0.0)  # [BLOCK_N, 512]

        if KV_MAJOR:
            s = tl.dot(kv, tl.trans(q)) * qk_scale  # S^T [BLOCK_N, 16], base-2 logits
            s = tl.where(active[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: keep exp2 finite
            alpha = tl.exp2(m - m_use)
            p = tl.exp2(s - m_use[None, :])
            l = l * alpha + tl.sum(p, axis=0)
            if FP8_PV:
                # P <= 1 scaled by 256 keeps small weights normal in E4M3.
                pv = tl.dot(tl.trans(kv), (p * 256.0).to(kv.dtype))
                acc = acc * alpha[None, :] + pv * (1.0 / 256.0)
            else:
                # FP16 holds every E4M3 value exactly and P (<= 1) with 11 significant bits.
                acc = acc * alpha[None, :] + tl.dot(tl.trans(kv.to(tl.float16)), p.to(tl.float16))
        else:
            s = tl.dot(q, tl.trans(kv)) * qk_scale  # [16, BLOCK_N], base-2 logits
            s = tl.where(active[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_use)
            p = tl.exp2(s - m_use[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            if FP8_PV:
                pv = tl.dot((p * 256.0).to(kv.dtype), kv)
                acc = acc * alpha[:, None] + pv * (1.0 / 256.0)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), kv.to(tl.float16))
        m = m_new

    part = t64 * splits + split
    if PARTIAL_F16:
        # O / l: bounded by max |kv| (an all-masked split has O = 0 and stays 0).
        inv_l = 1.0 / tl.maximum(l, 1e-30)
        if KV_MAJOR:
            acc = (acc * inv_l[None, :]).to(tl.float16)
        else:
            acc = (acc * inv_l[:, None]).to(tl.float16)
    if KV_MAJOR:
        tl.store(part_o_ptr + part * HEADS * D + rh[None, :] * D + rd[:, None], acc)
    else:
        tl.store(part_o_ptr + part * HEADS * D + rh[:, None] * D + rd[None, :], acc)
    tl.store(part_ml_ptr + part * 2 * HEADS + rh, m)
    tl.store(part_ml_ptr + part * 2 * HEADS + HEADS + rh, l)


@triton.jit
def _combine_kernel(part_o_ptr, part_ml_ptr, sinks_ptr, out_ptr, splits, bmm2_scale,
                    HEADS: tl.constexpr, D: tl.constexpr, SPLITS_P2: tl.constexpr,
                    HAS_SINKS: tl.constexpr, PDL: tl.constexpr, PARTIAL_F16: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    t64 = t.to(tl.int64)
    rs = tl.arange(0, SPLITS_P2)
    rd = tl.arange(0, D)
    ok = rs < splits
    if PDL:
        tl.extra.cuda.gdc_wait()  # the partials of the split kernel
        tl.extra.cuda.gdc_launch_dependents()
    base = t64 * splits + rs
    m = tl.load(part_ml_ptr + base * 2 * HEADS + h, mask=ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + base * 2 * HEADS + HEADS + h, mask=ok, other=0.0)
    m_all = tl.max(m, axis=0)
    any_active = m_all > float("-inf")
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h) * 1.4426950408889634
        m_all = tl.maximum(m_all, sink)
    m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_use)  # 0 for empty splits
    denom = tl.sum(w * l, axis=0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m_use)
    o = tl.load(part_o_ptr + (base[:, None] * HEADS + h) * D + rd[None, :], mask=ok[:, None], other=0.0)
    if PARTIAL_F16:  # the partials are O / l
        o = tl.sum(o.to(tl.float32) * (w * l)[:, None], axis=0)
    else:
        o = tl.sum(o * w[:, None], axis=0)
    scale = tl.where(any_active & (denom > 0), bmm2_scale / denom, 0.0)
    tl.store(out_ptr + (t64 * HEADS + h) * D + rd, (o * scale).to(tl.bfloat16))


class TritonSparseMla:
    """Workspace and launches for one (T, width, config); callable inside CUDA graph capture."""

    def __init__(self, T: int, width: int, device, config: Config = DEFAULT):
        self.T, self.width, self.config = T, width, config
        self.splits = config.splits(width)
        # The interpreter (TRITON_INTERPRET=1, CPU checks) has no grid-dependency control.
        self.pdl = config.pdl and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        self.part_o = torch.empty(max(T, 1) * self.splits * HEADS * HEAD_DIM, device=device,
                                  dtype=torch.float16 if config.fp16_partials else torch.float32)
        self.part_ml = torch.empty(max(T, 1) * self.splits * 2 * HEADS, dtype=torch.float32, device=device)

    def __call__(self, q, swa_kv, compressed_kv, indices, lens, *, sinks=None, bmm1_scale, bmm2_scale, out=None):
        T, width, c = self.T, self.width, self.config
        if tuple(q.shape) != (T, HEADS, HEAD_DIM) or tuple(indices.shape) != (T, width):
            raise ValueError(f"q {tuple(q.shape)} / indices {tuple(indices.shape)} do not match T={T}, width={width}")
        named = (("q", q), ("swa_kv", swa_kv), ("compressed_kv", compressed_kv), ("indices", indices), ("lens", lens))
        for name, x in named:
            if not x.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        if out is None:
            out = torch.empty(T, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        if T == 0:
            return out
        _split_kernel[(T, self.splits)](
            q, swa_kv, compressed_kv, indices, lens, self.part_o, self.part_ml,
            swa_kv.shape[0], compressed_kv.shape[0], width, float(bmm1_scale) * LOG2E,
            HEADS=HEADS, D=HEAD_DIM, SWA=SWA_COLUMNS, BLOCK_N=c.block_n, TILES=c.tiles, FP8_PV=c.fp8_pv,
            KV_MAJOR=c.kv_major, PDL=self.pdl, STAGES=c.num_stages, PARTIAL_F16=c.fp16_partials,
            num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=self.pdl)
        _combine_kernel[(T, HEADS)](
            self.part_o, self.part_ml, sinks if sinks is not None else self.part_ml, out,
            self.splits, float(bmm2_scale),
            HEADS=HEADS, D=HEAD_DIM, SPLITS_P2=triton.next_power_of_2(self.splits),
            HAS_SINKS=sinks is not None, PDL=self.pdl, PARTIAL_F16=c.fp16_partials, num_warps=4,
            launch_pdl=self.pdl)
        return out


def triton_sparse_mla_decode(q, swa_kv, compressed_kv, indices, lens, *, sinks=None, bmm1_scale, bmm2_scale,
                             out=None, config: Config = DEFAULT):
    """One call with a fresh workspace (tests); the benchmark keeps a ``TritonSparseMla``."""
    op = TritonSparseMla(q.shape[0], indices.shape[1], q.device, config)
    return op(q, swa_kv, compressed_kv, indices, lens, sinks=sinks, bmm1_scale=bmm1_scale,
              bmm2_scale=bmm2_scale, out=out)
