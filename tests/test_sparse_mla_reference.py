"""sparse_mla_decode on the CPU: the torch reference against a plain loop, and the host op's checks.

The loop below is the definition written out one token and one head at a time in float64, so the
vectorised reference (gathers, masks, chunking) is checked against something with no tricks in it.
The host op must reject bad arguments with an error naming them before it needs CUDA, so those
checks run here too.
"""

from __future__ import annotations

import math

import pytest
import torch
from odd_tensors import Storageless, at_byte_offset

from runtime.reference import sparse_mla_active, sparse_mla_decode_reference

FP8 = torch.float8_e4m3fn
H, D = 16, 512


def loop_reference(q, swa_kv, compressed_kv, indices, lens, sinks, bmm1_scale, bmm2_scale):
    """The op's definition, token by token and head by head, in float64."""
    T, width = indices.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    swa, comp = swa_kv.double(), compressed_kv.double()
    for t in range(T):
        rows = []
        for c in range(width):
            i = int(indices[t, c])
            pool = swa if c < 128 else comp
            if c < int(lens[t]) and 0 <= i < pool.shape[0]:
                rows.append(pool[i])
        if not rows:
            continue  # no active column: zeros, with sinks too
        kv = torch.stack(rows)
        for h in range(H):
            s = [bmm1_scale * float(q[t, h].double() @ row) for row in kv]
            m = max(s)
            if sinks is not None:
                m = max(m, float(sinks[h]))
            p = [math.exp(x - m) for x in s]
            denom = sum(p) + (math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
            acc = sum(pi * row for pi, row in zip(p, kv))
            out[t, h] = bmm2_scale * acc / denom
    return out


def make_inputs(T, width, *, swa_rows=64, comp_rows=700, q_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, H, D, generator=g) * q_scale).to(FP8)
    swa = torch.randn(swa_rows, D, generator=g).to(FP8)
    comp = torch.randn(comp_rows, D, generator=g).to(FP8)
    idx = torch.randint(0, swa_rows, (T, width), generator=g, dtype=torch.int32)
    if width > 128:
        idx[:, 128:] = torch.randint(0, comp_rows, (T, width - 128), generator=g, dtype=torch.int32)
    lens = torch.full((T,), width, dtype=torch.int32)
    return q, swa, comp, idx, lens


def check(q, swa, comp, idx, lens, sinks, bmm1_scale=0.04, bmm2_scale=1.0, **kw):
    got = sparse_mla_decode_reference(q, swa, comp, idx, lens, sinks=sinks, bmm1_scale=bmm1_scale,
                                      bmm2_scale=bmm2_scale, **kw)
    want = loop_reference(q, swa, comp, idx, lens, sinks, bmm1_scale, bmm2_scale)
    assert got.dtype == torch.bfloat16 and got.shape == (q.shape[0], H, D)
    # FP32 against float64, then one BF16 rounding: one BF16 unit in the last place apart, plus, where
    # the weighted sum cancels near zero, FP32 error relative to the largest |V| (the weights sum to
    # at most 1): the scores' D-term dot products and the width-term sum each contribute up to
    # terms * 2**-24 in the worst case, doubled for exp and the normalisation. The summation order is
    # torch's (threads, BLAS), so this bound, not one machine's error, sets the tolerance (one clean
    # CI run saw 5e-5 where this machine sees 2e-5).
    kv_max = max([float(pool.float().abs().max()) for pool in (swa, comp) if pool.numel()] + [0.0])
    atol = max(2e-5 * max(1.0, float(want.abs().max())),
               2 * (D + idx.shape[1]) * 2**-24 * kv_max * abs(bmm2_scale))
    torch.testing.assert_close(got.double(), want.to(torch.bfloat16).double(), rtol=2**-7, atol=atol)
    # That bound allows a BF16 unit on every element, so a systematic error below one (a scale 0.15 % off, under the
    # GPU tests' 2^-9 bias limit too) passed it. The BF16 rounding is zero-mean: the error's projection on the
    # definition stays within 1.6e-4 of |want|^2 on these cases (the GPU tests' _bias); 2^-11 leaves 3x margin.
    err = got.double() - want
    bias = float((err * want).sum() / (want * want).sum().clamp(min=1e-300))
    assert abs(bias) <= 2**-11, f"systematic relative error {bias:.3g} against the float64 definition"
    return got


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("width", [128, 640])
def test_full_sets(width, with_sinks):
    q, swa, comp, idx, lens = make_inputs(2, width, seed=width)
    sinks = torch.randn(H) * 2 if with_sinks else None
    check(q, swa, comp, idx, lens, sinks)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_masking_lens_minus_one_out_of_range_duplicates(with_sinks):
    T, width = 5, 640
    q, swa, comp, idx, lens = make_inputs(T, width, swa_rows=40, comp_rows=300, seed=1)
    lens[:] = torch.tensor([640, 1, 200, 129, 450], dtype=torch.int32)
    idx[0, ::7] = -1  # scattered -1
    idx[1, 0] = 39  # last swa row, only active column
    idx[2, 5:20] = 40  # first row past the swa pool
    idx[2, 130:140] = 300  # first row past the compressed pool
    idx[2, 141] = 2**31 - 1
    idx[2, 142] = -(2**31)
    idx[3, :] = idx[3, 0]  # duplicates within the swa chunk
    idx[3, 128] = 7  # one compressed column
    idx[4, 128:256] = -1  # a whole compressed chunk masked
    idx[4, 300:310] = idx[4, 299]  # duplicates within the compressed columns
    sinks = torch.randn(H) * 3 if with_sinks else None
    got = check(q, swa, comp, idx, lens, sinks)
    assert torch.isfinite(got.float()).all()


@pytest.mark.parametrize("with_sinks", [False, True])
def test_tokens_without_active_columns_are_zero(with_sinks):
    T, width = 4, 640
    q, swa, comp, idx, lens = make_inputs(T, width, seed=2)
    lens[0] = 0  # nothing before lens
    idx[1, :] = -1  # everything -1
    idx[2, :128] = 10_000  # everything past its pool
    idx[2, 128:] = 10_000
    sinks = torch.full((H,), 5.0) if with_sinks else None
    got = check(q, swa, comp, idx, lens, sinks)
    assert (got[:3] == 0).all()
    assert got[3].abs().sum() > 0


def test_empty_pools():
    q, swa, comp, idx, lens = make_inputs(2, 640, seed=3)
    comp = comp[:0]
    got = check(q, swa, comp, idx, lens, None)
    swa_only = sparse_mla_decode_reference(q, swa, comp, idx[:, :128].contiguous(), lens.clamp(max=128),
                                           bmm1_scale=0.04, bmm2_scale=1.0)
    torch.testing.assert_close(got, swa_only)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_large_scores_are_stable(with_sinks):
    # Scores in the thousands: any exp() taken without subtracting the maximum overflows.
    q, swa, comp, idx, lens = make_inputs(3, 640, q_scale=60.0, seed=4)
    lens[1] = 77
    sinks = torch.randn(H) * 100 if with_sinks else None
    got = check(q, swa, comp, idx, lens, sinks, bmm1_scale=1.0, bmm2_scale=0.5)
    assert torch.isfinite(got.float()).all()


def test_scores_far_below_zero_at_the_bmm1_bound():
    """Scores far below zero at the host op's largest bmm1_scale (1e30: every q.kv about -400, scores near -4e32) still
    weigh their columns: the masked columns' -inf must lie below any score, where a finite stand-in (-1e30) would take
    every weight and give zeros for the token's average row."""
    q, swa, comp, idx, lens = make_inputs(3, 640, seed=30)
    q = torch.ones(q.shape).to(FP8)
    swa, comp = ((-pool.float().abs() - 0.25).to(FP8) for pool in (swa, comp))  # every q.kv negative
    lens[:] = torch.tensor([640, 77, 200], dtype=torch.int32)
    idx[0, ::5] = -1
    got = check(q, swa, comp, idx, lens, None, bmm1_scale=1e30)
    assert (got.float().abs().amax(dim=-1) > 0.25).all()


def test_sink_dominates_to_zero():
    # A sink far above every score takes all the weight: the output goes to zero, not NaN.
    q, swa, comp, idx, lens = make_inputs(2, 128, seed=5)
    sinks = torch.full((H,), 1e4)
    got = check(q, swa, comp, idx, lens, sinks)
    assert (got == 0).all()


def test_chunking_does_not_change_the_result():
    q, swa, comp, idx, lens = make_inputs(9, 640, seed=6)
    # Not periodic in any chunk size below: with lens[::2] = 300 every chunk of 2 saw the first chunk's lens, so a
    # reference that sliced lens at the wrong offset (lens[:t1 - t0]) still passed this test.
    lens[:] = torch.tensor([640, 300, 0, 129, 640, 1, 300, 500, 128], dtype=torch.int32)
    kw = dict(sinks=torch.randn(H), bmm1_scale=0.04, bmm2_scale=1.5)
    b = sparse_mla_decode_reference(q, swa, comp, idx, lens, tokens_per_chunk=64, **kw)
    torch.testing.assert_close(b, check(q, swa, comp, idx, lens, kw["sinks"], 0.04, 1.5), rtol=0, atol=0)
    for chunk in (2, 4):
        a = sparse_mla_decode_reference(q, swa, comp, idx, lens, tokens_per_chunk=chunk, **kw)
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_active_mask():
    idx = torch.tensor([[0, -1, 5, 3] + [0] * 124 + [9, 10, -1, 2]], dtype=torch.int32)
    lens = torch.tensor([131], dtype=torch.int32)
    act = sparse_mla_active(idx, lens, swa_rows=5, compressed_rows=10)
    assert act[0, :4].tolist() == [True, False, False, True]
    assert act[0, 128:].tolist() == [True, False, False, False]  # 10 past the pool, -1, past lens


# --- the host op's argument checks: they run before anything needs CUDA -------------------------

def _valid_call(T=3, width=640):
    q, swa, comp, idx, lens = make_inputs(T, width, seed=9)
    kw = dict(sinks=torch.randn(H), bmm1_scale=0.04, bmm2_scale=1.0,
              out=torch.empty(T, H, D, dtype=torch.bfloat16))
    return [q, swa, comp, idx, lens], kw


ARGS = ("q", "swa_kv", "compressed_kv", "indices", "lens")


BAD = [
    # (argument, mutation of the valid value, expected exception)
    ("q", lambda v: v.float(), TypeError),
    ("q", lambda v: v.to(torch.float8_e5m2), TypeError),
    ("q", lambda v: v[:, :8].contiguous(), ValueError),  # 8 heads
    ("q", lambda v: v[..., :256].contiguous(), ValueError),  # head dim 256
    ("q", lambda v: v[0], ValueError),  # 2-D
    ("q", lambda v: v.transpose(1, 2).contiguous().transpose(1, 2), ValueError),  # not contiguous
    ("q", lambda v: at_byte_offset(v, 8), ValueError),
    ("q", lambda v: [1, 2], TypeError),
    ("swa_kv", lambda v: v.to(torch.bfloat16), TypeError),
    ("swa_kv", lambda v: v[:, :256].contiguous(), ValueError),
    ("swa_kv", lambda v: v.view(-1), ValueError),
    ("swa_kv", lambda v: at_byte_offset(v, 4), ValueError),
    ("swa_kv", lambda v: v.to("meta"), ValueError),  # another device than q
    ("compressed_kv", lambda v: v.view(torch.uint8), TypeError),
    ("compressed_kv", lambda v: v.view(-1, 1024), ValueError),
    ("compressed_kv", lambda v: v.t(), ValueError),
    ("compressed_kv", lambda v: at_byte_offset(v, 8), ValueError),
    ("compressed_kv", lambda v: v.to("meta"), ValueError),
    ("indices", lambda v: v.long(), TypeError),
    ("indices", lambda v: v[:, :256].contiguous(), ValueError),  # width 256 unsupported
    ("indices", lambda v: v[:, :100].contiguous(), ValueError),
    ("indices", lambda v: v[:2].contiguous(), ValueError),  # T mismatch
    ("indices", lambda v: v.t().contiguous().t(), ValueError),  # not contiguous
    ("indices", lambda v: v.to("meta"), ValueError),
    ("indices", lambda v: v[0], ValueError),
    ("lens", lambda v: v.long(), TypeError),
    ("lens", lambda v: v[:2].contiguous(), ValueError),
    ("lens", lambda v: v[None], ValueError),
    ("lens", lambda v: torch.zeros(6, dtype=torch.int32)[::2], ValueError),
    ("lens", lambda v: v.to("meta"), ValueError),
    ("sinks", lambda v: v.double(), TypeError),
    ("sinks", lambda v: v[:8].contiguous(), ValueError),
    ("sinks", lambda v: torch.zeros(32)[::2], ValueError),
    ("sinks", lambda v: v.to("meta"), ValueError),
    ("out", lambda v: v.float(), TypeError),
    ("out", lambda v: v[:2].contiguous(), ValueError),
    ("out", lambda v: v.transpose(1, 2).contiguous().transpose(1, 2), ValueError),
    ("out", lambda v: at_byte_offset(v, 2), ValueError),
    ("out", lambda v: v.to("meta"), ValueError),
    # DTensor-like wrappers (data_ptr 0, which the kernel would dereference)
    *[(name, Storageless, TypeError) for name in ("q", "swa_kv", "compressed_kv", "indices", "lens", "sinks", "out")],
    ("bmm1_scale", lambda v: "0.5", TypeError),
    ("bmm1_scale", lambda v: float("nan"), ValueError),
    ("bmm2_scale", lambda v: float("inf"), ValueError),
    ("bmm2_scale", lambda v: None, TypeError),
]


def _call_with(fn, name, mutate):
    args, kw = _valid_call()
    if name in ARGS:
        i = ARGS.index(name)
        args[i] = mutate(args[i])
    else:
        kw[name] = mutate(kw[name])
    return fn(*args, **kw)


@pytest.mark.parametrize("name,mutate,exc", BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD)])
def test_host_op_rejects_bad_arguments(name, mutate, exc):
    from runtime import sparse_mla
    for fn in (sparse_mla.sparse_mla_decode, sparse_mla.supports_sparse_mla):
        with pytest.raises(exc, match=rf"\b{name}\b"):
            _call_with(fn, name, mutate)


FIXES = [
    # (argument, mutation of the valid value, the fix the refusal names)
    ("q", lambda v: v.float(), r"; pass q\.to\(torch\.float8_e4m3fn\)"),
    # FP8 bytes kept as integers (as many engines store the cache): .to() would convert each byte's number
    ("swa_kv", lambda v: v.view(torch.uint8), r"; pass swa_kv\.view\(torch\.float8_e4m3fn\) where its bytes are E4M3"),
    ("q", lambda v: v.view(torch.int8), r"; pass q\.view\(torch\.float8_e4m3fn\) where its bytes are E4M3"),
    ("q", lambda v: torch.zeros(v.shape[0], H, 576).to(FP8), r"; pass 16 heads of the 512 latent dims"),
    ("out", lambda v: v.float(), r"; allocate it with dtype=torch\.bfloat16 \(or pass out=None\)"),
    ("indices", lambda v: v.t().contiguous().t(), r"; pass indices\.contiguous\(\)"),
    ("out", lambda v: v.transpose(1, 2).contiguous().transpose(1, 2), r"; pass a contiguous out \(or out=None\)"),
    ("swa_kv", lambda v: v.to("meta"), r"; pass every tensor on q's device"),
    ("compressed_kv", lambda v: at_byte_offset(v, 8), r"bytes past one\); pass a tensor that torch allocated"),
    ("bmm1_scale", lambda v: torch.tensor(v), r"got Tensor; pass a Python float"),
    # out receives the result: out.clone() would take it instead of the caller's buffer
    ("out", lambda v: at_byte_offset(v, 2), r"bytes past one\); pass an out that torch allocated \(or out=None\)$"),
]


@pytest.mark.parametrize("name,mutate,fix", FIXES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(FIXES)])
def test_host_op_refusals_say_the_fix(name, mutate, fix):
    """The refusals named the argument and what was wrong ("swa_kv is on meta, q on cpu", "bmm1_scale must be a real
    number, got Tensor") but not what to pass; they say it now."""
    from runtime import sparse_mla
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b.*{fix}"):
        _call_with(sparse_mla.sparse_mla_decode, name, mutate)


@pytest.mark.parametrize("mutate", [lambda v: v.bfloat16(), lambda v: torch.zeros(32)[::2],
                                    lambda v: at_byte_offset(v, 2)], ids=("dtype", "strided", "unaligned"))
def test_sinks_refusals_say_to_convert_once(mutate):
    """With PDL (the default) the kernel reads the sinks before it waits for the kernel before it: a copy made each call
    (sinks.to(torch.float32), .contiguous(), .clone()) is written by that kernel, which the docstring forbids. The
    refusals said to pass such a copy; they say to make it once, or to pass pdl=False."""
    from runtime import sparse_mla
    with pytest.raises((TypeError, ValueError), match=r"^sinks\b.*once.*or pass pdl=False"):
        _call_with(sparse_mla.sparse_mla_decode, "sinks", mutate)


def test_host_op_fallback_writes_an_out_made_under_inference_mode():
    """A serving engine may allocate its output buffers under torch.inference_mode() at start-up and call the op
    outside it: the kernel writes such an out through its pointer, while the fallback's copy_ raised torch's
    RuntimeError (naming no argument) after the whole reference ran. The fallback writes it too, in and out of the
    mode."""
    from runtime import sparse_mla
    args, kw = _valid_call()
    with torch.inference_mode():
        out = torch.full_like(kw["out"], float("nan"))
    kw["out"] = out
    want = sparse_mla_decode_reference(*args, sinks=kw["sinks"], bmm1_scale=0.04, bmm2_scale=1.0)
    assert sparse_mla.sparse_mla_decode(*args, **kw) is out
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    with torch.inference_mode():
        out.fill_(float("nan"))
        sparse_mla.sparse_mla_decode(*args, **kw)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_host_op_accepts_valid_arguments_on_cpu():
    # On a machine without the cache's GPU the op computes with the reference, exactly.
    from runtime import sparse_mla
    args, kw = _valid_call()
    out = kw["out"].fill_(float("nan"))
    assert sparse_mla.sparse_mla_decode(*args, **kw) is out
    want = sparse_mla_decode_reference(*args, sinks=kw["sinks"], bmm1_scale=0.04, bmm2_scale=1.0)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert sparse_mla.supports_sparse_mla(*args, **kw) is False  # no kernel for the CPU
    kw.pop("out")
    got = sparse_mla.sparse_mla_decode(*args, **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_host_op_width_check():
    """A width the kernels do not take is refused naming it and the widths they take (the fix), on a machine with a
    device or without one (max_tokens answers 0 there for a supported width, without asking about the device): any
    ValueError that said "width" passed before, so did one that dropped the widths."""
    from runtime import sparse_mla
    for width in (0, 64, 127, 129, 256, 512, 639, 641, 768):
        for device in (None, "cuda:0", "cpu"):
            with pytest.raises(ValueError, match=rf"^width {width} is not supported; widths: \(128, 640\)$"):
                sparse_mla.max_tokens(width, device)


def test_second_product_k_order_matches_the_fragment_and_is_conflict_free():
    """The kernel numbers the second product's K so that each ldmatrix matrix of a V^T fragment reads eight
    consecutive tile rows (_pv_k): lane l of K step ks gives tile row 32 ks + l, which must hold the K index that
    Hopper's m64nNk32 A fragment expects from that lane's matrix row, every K index exactly once, and rows g and
    g + 8 of a head's P^T must land in one 16-byte chunk (k, k + 2: one conversion stores both). On the
    128B-swizzled tile the eight rows of a matrix then fall in eight different bank groups."""
    pytest.importorskip("cutlass")
    from kernels.sparse_mla_decode import _pv_k, _swz

    assert sorted(_pv_k(r) for r in range(128)) == list(range(128))
    for ks in range(4):
        for lane in range(32):
            mi, i = lane >> 3, lane & 7  # matrix mi, its row i
            assert _pv_k(32 * ks + lane) == 32 * ks + 16 * (mi >> 1) + 2 * (mi & 1) + 4 * (i >> 1) + (i & 1)
        for mi in range(4):
            groups = {(_swz(32 * ks + 8 * mi + i, 0) >> 4) & 7 for i in range(8)}
            assert len(groups) == 8, (ks, mi, groups)
    for rr in (64 * mt + 16 * warp + g for mt in range(2) for warp in range(4) for g in range(8)):
        assert _pv_k(rr + 8) == _pv_k(rr) + 2 and _pv_k(rr) >> 4 == rr >> 4 and (_pv_k(rr) & 15) + 2 < 16


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode) on Python ints: byte i of the result is byte (selector >> 4 i) & 7 of {b, a}."""
    pool = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    return sum(((pool >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def test_p_word_stores_build_the_p_tile():
    """The kernel stores P^T as words (_store_p): lanes g and g ^ 1 swap half of their byte pairs by one shuffle and
    each stores two heads' words, built with the prmt selectors P_PAIRS_PACK, P_WORD_EVEN and P_WORD_ODD at
    _p_word_addr. Emulated for every lane of every warp, the tile must equal its definition: head h's K index
    k = _pv_k(row) holds P[row, h] at byte (k & 15) of the swizzled chunk _swz(h, k >> 4), every byte written once."""
    pytest.importorskip("cutlass")
    from kernels.sparse_mla_decode import (
        P_PAIRS_PACK,
        P_WORD_EVEN,
        P_WORD_ODD,
        _acc_heads,
        _p_word_addr,
        _pv_k,
        _swz,
    )

    heads_n, rows_n = 16, 128
    value = {(row, h): (7 * row + 31 * h + 1) & 0xFF for row in range(rows_n) for h in range(heads_n)}
    expected = bytearray(heads_n * 128)
    for (row, h), v in value.items():
        k = _pv_k(row)
        expected[_swz(h, k >> 4) + (k & 15)] = v
    tile = bytearray(heads_n * 128)
    written = [0] * (heads_n * 128)
    for warp in range(4):
        for mt in range(2):
            # Lane l: accumulator rows rr and rr + 8 (g = l >> 2) of the four heads of its column slots (t4 = l & 3).
            lanes = [(lane >> 2, 64 * mt + 16 * warp + (lane >> 2), _acc_heads(lane & 3)) for lane in range(32)]
            pairs = [[value[(rr, h)] | (value[(rr + 8, h)] << 8) for h in heads] for _, rr, heads in lanes]
            sends = [_prmt(*(p[:2] if g & 1 else p[2:]), P_PAIRS_PACK) for (g, _, _), p in zip(lanes, pairs)]
            for lane, (g, rr, heads) in enumerate(lanes):
                odd = g & 1
                recv = sends[lane ^ 4]
                for j in range(2):
                    if odd:
                        word, h = _prmt(pairs[lane][2 + j], recv, P_WORD_ODD[j]), heads[2 + j]
                    else:
                        word, h = _prmt(pairs[lane][j], recv, P_WORD_EVEN[j]), heads[j]
                    addr = _p_word_addr(0, h, rr, g)
                    assert addr % 4 == 0
                    tile[addr:addr + 4] = word.to_bytes(4, "little")
                    for i in range(4):
                        written[addr + i] += 1
    assert written == [1] * (heads_n * 128)
    assert tile == expected


@pytest.mark.parametrize("with_sinks", [False, True])
def test_owner_weighted_chunk_merge(with_sinks):
    """The cluster kernel's merge, in torch: each chunk c stages O_c / l_c in FP16 (its own softmax sum only, base 2,
    the max stand-in NEG_BIG for an all-masked chunk, l clamped), and the owner adds the staged blocks times
    bmm2_scale l_c 2^(m_c - M) / L. It must give the op, with a token whose last chunks are all masked, one with no
    active column, and one whose sink outweighs its columns; the only rounding is FP16's on the staged blocks."""
    pytest.importorskip("cutlass")
    from kernels.sparse_mla_decode import LOG2E, NEG_BIG

    q, swa, comp, idx, lens = make_inputs(5, 640, seed=11, q_scale=3.0)
    lens[1], lens[2], idx[3, :300] = 200, 0, -1
    sinks = torch.randn(H) * 4 if with_sinks else None
    if with_sinks:
        sinks[5] = 60.0  # head 5: the sink takes nearly all the weight
    bmm1_scale, bmm2_scale = 0.04, 1.5
    active = sparse_mla_active(idx, lens, swa.shape[0], comp.shape[0])
    cols = torch.arange(640)
    pools = torch.where((cols < 128)[None, :, None], swa.float()[idx.clamp(0, swa.shape[0] - 1).long()],
                        comp.float()[idx.clamp(0, comp.shape[0] - 1).long()]) * active[..., None]
    s = torch.einsum("thd,twd->thw", q.float(), pools) * (bmm1_scale * LOG2E)
    s = s.masked_fill(~active[:, None, :], float("-inf")).view(5, H, 5, 128)
    m_c = s.amax(-1).clamp(min=NEG_BIG)  # [t, h, c]
    p = torch.exp2(s - m_c[..., None])
    l_c = p.sum(-1)
    o_c = torch.einsum("thcw,tcwd->thcd", p, pools.view(5, 5, 128, D))
    staged = (o_c / l_c.clamp(min=1e-30)[..., None]).half().float()
    sink2 = sinks.float()[None, :, None] * LOG2E if with_sinks else torch.full((1, H, 1), NEG_BIG)
    big_m = torch.maximum(m_c.amax(-1, keepdim=True), sink2)
    big_l = (l_c * torch.exp2(m_c - big_m)).sum(-1, keepdim=True)
    if with_sinks:
        big_l = big_l + torch.exp2(sink2 - big_m)
    weight = bmm2_scale * l_c * torch.exp2(m_c - big_m) / big_l.clamp(min=1e-30)
    got = (weight[..., None] * staged).sum(2)
    assert torch.isfinite(got).all() and (got[2] == 0).all()
    want = loop_reference(q, swa, comp, idx, lens, sinks, bmm1_scale, bmm2_scale).float()
    # FP16 keeps 11 bits of each staged block, |O_c / l_c| <= max |kv|, and the weights sum to at most bmm2_scale.
    kv_max = max(float(swa.float().abs().max()), float(comp.float().abs().max()))
    torch.testing.assert_close(got, want, rtol=0, atol=2.0 ** -11 * kv_max * bmm2_scale)


def test_host_op_rejects_out_overlapping_an_input():
    """The kernel reads q, the pools, indices, lens and sinks while other CTAs write out: an out sharing any byte
    with them (fully or partly) is refused; disjoint parts of one buffer are fine."""
    from runtime import sparse_mla
    args, kw = _valid_call(T=3)
    q = args[0]
    raw = torch.zeros(3 * H * D * 2 + 3 * H * D, dtype=torch.uint8)
    out = raw[:3 * H * D * 2].view(torch.bfloat16).view(3, H, D)
    for name, view in (("q", raw[H * D * 2:H * D * 2 + q.numel()]),  # q starts in out's second token
                       ("q", raw[:q.numel()])):  # the same start
        args[0] = view.view(FP8).view(q.shape).copy_(q)
        for fn in (sparse_mla.sparse_mla_decode, sparse_mla.supports_sparse_mla):
            with pytest.raises(ValueError, match=rf"out overlaps {name}\b"):
                fn(*args, **{**kw, "out": out})
    lens_in_out = out.view(-1).view(torch.int32)[5:8]
    lens_in_out.copy_(args[4])
    with pytest.raises(ValueError, match=r"out overlaps lens\b"):
        sparse_mla.sparse_mla_decode(q, *args[1:4], lens_in_out, **{**kw, "out": out})
    args[0] = raw[3 * H * D * 2:].view(FP8).view(q.shape).copy_(q)  # right behind out: disjoint
    sparse_mla.sparse_mla_decode(*args, **{**kw, "out": out})
    want = sparse_mla_decode_reference(*args, sinks=kw["sinks"], bmm1_scale=0.04, bmm2_scale=1.0)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", (*ARGS, "sinks"))
def test_host_op_rejects_out_overlapping_each_input(name):
    """Every input the kernel reads is checked against out, not only q and lens: each placed so that its first bytes
    are out's last (a partial overlap) is refused naming it, by the op and by its query."""
    from runtime import sparse_mla

    args, kw = _valid_call(T=3)
    value = args[ARGS.index(name)] if name in ARGS else kw[name]
    out_bytes, in_bytes = 3 * H * D * 2, value.numel() * value.element_size()
    raw = torch.zeros(out_bytes + in_bytes, dtype=torch.uint8)
    out = raw[:out_bytes].view(torch.bfloat16).view(3, H, D)
    start = out_bytes - 16  # 16-byte aligned, as every input must be
    inside = raw[start:start + in_bytes].view(value.dtype).view(value.shape).copy_(value)
    if name in ARGS:
        args[ARGS.index(name)] = inside
    else:
        kw[name] = inside
    for fn in (sparse_mla.sparse_mla_decode, sparse_mla.supports_sparse_mla):
        with pytest.raises(ValueError, match=rf"out overlaps {name}\b"):
            fn(*args, **{**kw, "out": out})


@pytest.mark.parametrize("value", [1e39, -1e39, 10 ** 400, 10 ** 5000], ids=("1e39", "-1e39", "10**400", "10**5000"))
def test_host_op_rejects_scales_past_float32(value):
    """The kernel takes the scales as float32: a finite double past its range would become inf there (NaN outputs),
    and an int past a double's range must not escape as OverflowError. Nor as the ValueError of printing an int of
    over 4300 digits, which names no argument (the message shows the scale as a float)."""
    from runtime import sparse_mla
    for name in ("bmm1_scale", "bmm2_scale"):
        with pytest.raises(ValueError, match=rf"\b{name}\b"):
            _call_with(sparse_mla.sparse_mla_decode, name, lambda v: value)


def test_bmm1_scale_bound_keeps_the_kernels_base2_scores_finite():
    """The kernel computes q.kv * bmm1_scale * log2(e) in float32 and floors a chunk's max at -3e38 (its stand-in for
    -inf): a scale past FLT_MAX / log2(e) made the factor inf (NaN scores for a zero query), and any scale that takes
    a score past +-3e38 gave zeros or NaN where the reference is finite. The host op bounds |bmm1_scale| by 1e30,
    under which the largest E4M3 score (448^2 * 512) stays within half the stand-in; the bound itself passes."""
    import numpy as np

    from runtime import sparse_mla
    from runtime.contract.sparse_mla_decode import NEG_BIG
    log2e = np.float32(math.log2(math.e))
    largest = np.float32(448.0 ** 2 * 512)
    assert largest == sparse_mla._MAX_QK
    bound = sparse_mla._BMM1_SCALE_MAX
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float32(bound) * log2e * largest)
        assert abs(float(np.float32(bound) * log2e * largest)) < 0.5 * -NEG_BIG
        assert float(np.float32(2.2e38) * log2e * np.float32(-1.0)) < NEG_BIG  # a score of -1 past the stand-in
    for too_big in (3e38, 2.2e38, 1.01 * bound, -1.01 * bound):
        with pytest.raises(ValueError, match=r"\bbmm1_scale\b.*every score stays finite"):
            _call_with(sparse_mla.sparse_mla_decode, "bmm1_scale", lambda v, b=too_big: b)
    for fine in (bound, -bound, 0.04):
        _call_with(sparse_mla.sparse_mla_decode, "bmm1_scale", lambda v, b=fine: b)  # checks pass (CPU: reference)
    # bmm2_scale multiplies the weights before they are normalised: by 1 / (256 * 1e-30) for a token with no active
    # column at width 128 (its O is 0: an overflow gives 0 * inf = NaN where the reference writes zeros), by a
    # chunk's sum of up to 128 at width 640. Both stay finite in float32 at the bound, not at 1e11 or 3e38.
    bound2 = sparse_mla._BMM2_SCALE_MAX
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float32(bound2) * np.float32(1 / 256) * (np.float32(1) / np.float32(1e-30)))
        assert not np.isfinite(np.float32(1e11) * np.float32(1 / 256) * (np.float32(1) / np.float32(1e-30)))
        assert not np.isfinite(np.float32(3e38) * np.float32(128))
    for too_big in (3e38, 1e11, 1.01 * bound2, -1.01 * bound2):
        with pytest.raises(ValueError, match=r"^bmm2_scale must be small enough that the kernel's weights stay "
                                             r"finite; scale the output instead .*<= 1e\+10"):
            _call_with(sparse_mla.sparse_mla_decode, "bmm2_scale", lambda v, b=too_big: b)
    for fine in (bound2, -bound2, 1.0):
        _call_with(sparse_mla.sparse_mla_decode, "bmm2_scale", lambda v, b=fine: b)  # checks pass (CPU: reference)


@pytest.mark.parametrize("flag", ["False", 0, 1], ids=repr)
def test_host_op_takes_pdl_as_a_bool_only(flag):
    """pdl="False" is true: it would launch with PDL, the sinks read before the previous grid's writes."""
    from runtime import sparse_mla
    args, kw = _valid_call()
    with pytest.raises(TypeError, match=r"^pdl must be a Python bool"):
        sparse_mla.sparse_mla_decode(*args, **kw, pdl=flag)
    sparse_mla.sparse_mla_decode(*args, **kw, pdl=False)  # checks pass (CPU: reference)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_masked_columns_are_never_read(with_sinks):
    """Masked columns (past lens, -1, past the pool) and tokens without active columns read no pool row:
    NaN bytes in rows the active columns do not name change nothing, and an empty token stays zero."""
    T, width = 4, 640
    q, swa, comp, idx, lens = make_inputs(T, width, seed=7)
    idx[:, :128] = torch.where(idx[:, :128] == 0, 1, idx[:, :128])  # row 0 of each pool is never named
    idx[:, 128:] = torch.where(idx[:, 128:] == 0, 1, idx[:, 128:])
    lens[0] = 0  # an empty token
    idx[1, 5:40] = -1
    idx[2, 200:260] = 10_000
    lens[3] = 300
    sinks = torch.randn(H) if with_sinks else None
    want = check(q, swa, comp, idx, lens, sinks)
    for pool in (swa, comp):
        pool.view(torch.uint8)[0] = 0xFF  # E4M3 NaN in every byte of row 0
    got = check(q, swa, comp, idx, lens, sinks)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (got[0] == 0).all() and torch.isfinite(got.float()).all()


def _forget_refusals(monkeypatch):
    """A fresh memo of the devices the cache refused (runtime.loader.cache_or_fallback) for this test."""
    from runtime import loader

    monkeypatch.setattr(loader, "_bound", {})
    monkeypatch.setattr(loader, "_refusals_said", set())


def test_refused_cache_is_loaded_once(monkeypatch):
    """A device the cache cannot serve is asked once: every later call goes straight to the reference instead of
    paying the refused load again, and the refusal is said once."""
    import runtime
    from runtime import sparse_mla

    calls = []

    def refuse(device=None, root=None):
        calls.append(device)
        raise runtime.CacheError("no manifest for this device's arch")

    monkeypatch.setattr(runtime, "load", refuse)
    monkeypatch.setattr(sparse_mla, "_kernels", {})
    _forget_refusals(monkeypatch)
    device = torch.device("cuda", 0)
    with pytest.warns(RuntimeWarning, match="cannot serve cuda:0.*no manifest") as said:
        assert sparse_mla._kernel(640, True, device) is None
    assert said[0].filename == __file__, "the warning names the caller's line"
    assert sparse_mla._kernel(640, True, device) is None
    assert calls == [0]


def test_concurrent_first_calls_load_once(monkeypatch):
    """Eight threads' first calls on a device the cache refuses: one load, one warning (the memo is locked)."""
    import threading
    import time

    import runtime
    from runtime import sparse_mla

    loads, warned = [], []

    def slow_refusal(device=None, root=None):
        loads.append(device)
        time.sleep(0.05)  # every thread reaches the memo while the first load is under way
        raise runtime.CacheError("no manifest")

    monkeypatch.setattr(runtime, "load", slow_refusal)
    monkeypatch.setattr(runtime.loader, "warn_fallback", lambda *a: warned.append(a))
    monkeypatch.setattr(sparse_mla, "_kernels", {})
    _forget_refusals(monkeypatch)
    start = threading.Barrier(8)

    def first_call():
        start.wait()
        sparse_mla._kernel(640, True, torch.device("cuda", 0))

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(warned) == 1


def test_max_tokens_without_a_cuda_device(monkeypatch):
    """max_tokens(width) says 0 on a machine where torch sees no CUDA device, as its docstring promises."""
    from runtime import sparse_mla

    monkeypatch.setattr(sparse_mla.torch.cuda, "is_available", lambda: False)
    assert sparse_mla.max_tokens(640) == 0
    assert sparse_mla.max_tokens(128, "cpu") == 0


def test_max_tokens_takes_integer_widths_only(monkeypatch):
    """max_tokens(128.0) would pass the membership test (128.0 == 128), name no cached variant, and memoize a
    refusal under the key of width 128: every later width-128 call on the device would run the reference. A float
    or bool width is refused; a numpy integer is asked about as the int it is."""
    np = pytest.importorskip("numpy")
    from runtime import sparse_mla

    asked = []
    monkeypatch.setattr(sparse_mla, "_held_kernel", lambda width, sinks, device: asked.append(width))
    for width in (128.0, np.float64(640), True, "128"):
        with pytest.raises(TypeError, match="width: expected an integer"):
            sparse_mla.max_tokens(width, "cuda:0")
    assert asked == []
    assert sparse_mla.max_tokens(np.int64(640), "cuda:0") == 0
    assert asked == [640, 640] and all(type(w) is int for w in asked)  # either variant asked about
    with pytest.raises(ValueError, match="width 256 is not supported"):
        sparse_mla.max_tokens(256, "cuda:0")


def test_max_tokens_of_a_cache_with_one_variant_of_the_width(monkeypatch):
    """max_tokens asked the cache for the sinks variant only: with a cache built without it (build_kernels.py --only)
    it said 0 while every call without sinks ran on the kernel. Either variant answers (they share the grid, the
    cluster and the occupancy); 0 only where the cache has neither."""
    from runtime import sparse_mla

    kernel = type("Kernel", (), {"max_active_clusters": 52})()
    for held, want in ((False, 52), (True, 52), (None, 0)):
        monkeypatch.setattr(sparse_mla, "_held_kernel",
                            lambda width, sinks, device, held=held: kernel if sinks is held else None)
        assert sparse_mla.max_tokens(640, "cuda:0") == want


# --- review additions: lens outside [0, width], -inf sinks, and the GPU tests' tolerance on the CPU ---------------

@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("width", [128, 640])
def test_lens_outside_zero_width_and_minus_inf_sink(width, with_sinks):
    """lens past the width count as full, negative lens as empty (zeros, with sinks too); a -inf sink
    weighs nothing. The host op cannot check device-side lens, so the reference must define them."""
    q, swa, comp, idx, lens = make_inputs(6, width, seed=12)
    lens[:] = torch.tensor([width + 1, 2 ** 31 - 1, -1, -(2 ** 31), 1, width], dtype=torch.int32)
    sinks = torch.randn(H) * 2 if with_sinks else None
    if with_sinks:
        sinks[3] = float("-inf")
    got = check(q, swa, comp, idx, lens, sinks)
    assert (got[2:4] == 0).all()
    full = sparse_mla_decode_reference(q, swa, comp, idx, torch.full_like(lens, width), sinks=sinks,
                                       bmm1_scale=0.04, bmm2_scale=1.0)
    torch.testing.assert_close(got[:2], full[:2], rtol=0, atol=0)
    assert torch.isfinite(got.float()).all()


@pytest.mark.parametrize("width", [128, 640])
def test_sinks_that_take_all_the_weight(width):
    """A sink of +inf, or one far above every score (3e38, FLT_MAX), takes all its head's weight: zeros, as the kernel
    gives (the sinks are device values the host op does not check). The reference set the running max to 0 where it
    was not finite, so a +inf sink met exp(score) of large scores: NaN (inf / inf), where the kernel wrote zeros."""
    q, swa, comp, idx, lens = make_inputs(4, width, q_scale=40.0, seed=21)  # scores in the hundreds: exp() overflows
    sinks = torch.randn(H) * 2
    heavy = [2, 5, 7]
    sinks[heavy] = torch.tensor([float("inf"), 3.0e38, torch.finfo(torch.float32).max])
    got = sparse_mla_decode_reference(q, swa, comp, idx, lens, sinks=sinks, bmm1_scale=0.04, bmm2_scale=1.0)
    assert not got.isnan().any() and (got[:, heavy] == 0).all()
    plain = sinks.clone()
    plain[heavy] = 0.0
    rest = [h for h in range(H) if h not in heavy]
    base = sparse_mla_decode_reference(q, swa, comp, idx, lens, sinks=plain, bmm1_scale=0.04, bmm2_scale=1.0)
    torch.testing.assert_close(got[:, rest], base[:, rest], rtol=0, atol=0)


def _gpu_helpers():
    import test_sparse_mla_gpu as gpu_tests  # the GPU module's helpers are plain torch

    return gpu_tests


@pytest.mark.parametrize("pools", ["both", "empty_compressed", "empty_swa"])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("width", [128, 640])
def test_gpu_edge_case_reference_matches_loop(width, with_sinks, pools):
    """The inputs of test_sparse_mla_gpu.test_kernel_edge_inputs: the reference against the loop, and the
    GPU test's own budget machinery (emulate, rounding_bounds) runs on them, the emulation within it."""
    G = _gpu_helpers()
    rows = dict(both=(64, 700), empty_compressed=(64, 0), empty_swa=(0, 700))[pools]
    args, sinks = G.make_edge_case(width, device="cpu", swa_rows=rows[0], comp_rows=rows[1], seed=width)
    sinks = sinks if with_sinks else None
    got = check(*args, sinks, bmm1_scale=G.BMM1_SCALE, bmm2_scale=G.BMM2_SCALE)
    assert torch.isfinite(got.float()).all()
    emu = G.emulate(*args, sinks=sinks, bmm1_scale=G.BMM1_SCALE, bmm2_scale=G.BMM2_SCALE)
    G.assert_kernel_matches(emu, args, sinks)
    _assert_emulation_within_analytic_bounds(G, args, sinks)


def _assert_emulation_within_analytic_bounds(G, args, sinks, p_dtype=None, **scales):
    """The budget's emulation term (3 x the same-precision emulation's largest error, a token) lets the emulation
    pass assert_kernel_matches by construction: here the analytic bounds alone (P's rounding, the accumulator, a BF16
    ulp; no emulation term) must hold the emulation's error, or they would not stand for the kernel's rounding."""
    kw = dict(sinks=sinks, bmm1_scale=G.BMM1_SCALE, bmm2_scale=G.BMM2_SCALE, p_dtype=p_dtype or G.FP8) | scales
    ref = sparse_mla_decode_reference(*args, **{k: v for k, v in kw.items() if k != "p_dtype"}).float()
    emu = G.emulate(*args, **kw).float()
    _, top = G.token_terms(ref, emu)
    over = (emu - ref).abs() - G.error_budget(torch.zeros_like(top), top, G.rounding_bounds(*args, **kw))
    assert (over <= 0).all(), f"the emulation's error passes the analytic bounds by {float(over.max()):.3g}"


def _mutations(G, args, sinks):
    """Plausible kernel bugs, as outputs: each must fail the GPU tests' check."""
    q, swa, comp, idx, lens = args
    width = idx.shape[1]
    kw = dict(bmm1_scale=G.BMM1_SCALE, bmm2_scale=G.BMM2_SCALE)
    rows = torch.where(torch.arange(width) < 128, swa.shape[0], comp.shape[0]).to(torch.int32)
    at_end = torch.where(idx == rows[None], rows[None] - 1, idx)  # "< rows" written "<= rows" (clamped read)
    out = {
        "bmm2_scale x1.01": sparse_mla_decode_reference(*args, sinks=sinks, bmm1_scale=G.BMM1_SCALE,
                                                        bmm2_scale=G.BMM2_SCALE * 1.01),
        "bmm1_scale x1.02": sparse_mla_decode_reference(*args, sinks=sinks, bmm1_scale=G.BMM1_SCALE * 1.02,
                                                        bmm2_scale=G.BMM2_SCALE),
        "lens + 1": sparse_mla_decode_reference(q, swa, comp, idx, (lens + 1).clamp(max=width), sinks=sinks, **kw),
        "index == rows read": sparse_mla_decode_reference(q, swa, comp, at_end, lens, sinks=sinks, **kw),
        "phantom sink 0" if sinks is None else "sink ignored":
            sparse_mla_decode_reference(*args, sinks=torch.zeros(H) if sinks is None else None, **kw),
    }
    return out


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("width", [128, 640])
def test_gpu_tolerance_rejects_plausible_bugs(width, with_sinks):
    """The GPU tests' check (assert_kernel_matches) on the CPU: a same-precision emulation passes it, and
    outputs with a plausible kernel bug fail it. Before the bias check, a 1 % scale error passed (the
    elementwise budget is ~25 % of the median |out|: 3 x the token's largest FP8-P emulation error), and
    so did a phantom sink at width 640 on make_case's tokens (make_edge_case's 1- and 2-column tokens catch it)."""
    G = _gpu_helpers()
    passed = []
    for args, sinks in (G.make_case(48, width, seed=31 + width, device="cpu"),
                        G.make_edge_case(width, device="cpu", swa_rows=64, comp_rows=700, seed=width)):
        sinks = sinks if with_sinks else None
        G.assert_kernel_matches(G.emulate(*args, sinks=sinks, bmm1_scale=G.BMM1_SCALE, bmm2_scale=G.BMM2_SCALE),
                                args, sinks)
        _assert_emulation_within_analytic_bounds(G, args, sinks)
        caught = set()
        for name, got in _mutations(G, args, sinks).items():
            try:
                G.assert_kernel_matches(got, args, sinks)
            except AssertionError:
                caught.add(name)
            else:
                passed.append((int(args[0].shape[0]), name))
        if args[0].shape[0] == 10:  # make_edge_case: every mutation must be caught there
            assert caught == set(_mutations(G, args, sinks)), passed
        if args[0].shape[0] == 48:  # make_case's many tokens: a scale 0.3 % off fails on its systematic error alone
            small = sparse_mla_decode_reference(*args, sinks=sinks, bmm1_scale=G.BMM1_SCALE,
                                                bmm2_scale=G.BMM2_SCALE * 1.003)
            with pytest.raises(AssertionError, match="systematic relative error"):
                G.assert_kernel_matches(small, args, sinks)
    # make_case alone (the existing matrix): the scale errors at least.
    assert not [p for p in passed if p[0] == 48 and p[1].startswith("bmm")], passed


@pytest.mark.parametrize("width", [128, 640])
def test_bf16_p_bounds_hold_the_emulation(width):
    """P in BF16 (the Triton peer's configurations without FP8 P): the analytic bounds hold the emulation's error."""
    G = _gpu_helpers()
    args, sinks = G.make_case(12, width, seed=5 + width, device="cpu")
    _assert_emulation_within_analytic_bounds(G, args, sinks, p_dtype=torch.bfloat16)


@pytest.mark.parametrize("sink", [None, -1000.0])
def test_emulation_skips_masked_chunks_in_the_merge(sink):
    """Width 640, the SWA chunk masked, every compressed column on one row, scores of -307: the emulation equals the
    reference (bmm2_scale times the row). It once merged the masked chunk's stand-in max of 0 with the others' -307,
    and exp(-307) wrote 0 (the random sweep's draw 440)."""
    G = _gpu_helpers()
    fp8 = torch.float8_e4m3fn
    q = torch.ones(1, 16, 512).to(fp8)
    swa, comp = torch.ones(4, 512).to(fp8), torch.full((3, 512), 2.0).to(fp8)
    indices = torch.cat([torch.full((1, 128), -1), torch.zeros(1, 512)], 1).to(torch.int32)
    lens = torch.tensor([640], dtype=torch.int32)
    sinks = None if sink is None else torch.full((16,), sink)
    kw = dict(sinks=sinks, bmm1_scale=-0.3, bmm2_scale=0.75)
    want = sparse_mla_decode_reference(q, swa, comp, indices, lens, **kw)
    assert torch.equal(want.float(), torch.full((1, 16, 512), 1.5))
    assert torch.equal(G.emulate(q, swa, comp, indices, lens, **kw), want)


def test_random_sweep_draws_on_the_cpu():
    """The GPU random sweep's calls of 1 to 13 tokens (test_sparse_mla_gpu.test_random_calls_match_the_reference, its
    first 300 draws with the H200's wave sizes) on the CPU, for the check it applies:
    - the analytic bounds hold the emulation's error. The sweep's draw 440 (width 640, scores of -290 and below next
      to a masked chunk) found the emulation merging a masked chunk's stand-in max of 0: those heads came out 0,
      25 % of the token's output, and the budget built on that error was loose there;
    - the emulation passes the check (its systematic error reaches 0.005 on one or two tokens, so the check compares
      the kernel's with it rather than bounding it);
    - an output 1 % too large fails it on its systematic error."""
    import random

    G = _gpu_helpers()
    rng = random.Random(G.FUZZ_SEED)
    checked = set()
    for i in range(300):
        T, width, _, _, scales = draw = G.fuzz_draw(rng, {128: 264, 640: 47}.get)
        if not 1 <= T <= 13:
            continue
        args, sinks = G.fuzz_case(i, draw, device="cpu")
        _assert_emulation_within_analytic_bounds(G, args, sinks, **scales)
        G.assert_kernel_matches(G.emulate(*args, sinks=sinks, **scales), args, sinks, **scales)
        scaled = {**scales, "bmm2_scale": scales["bmm2_scale"] * 1.01}
        with pytest.raises(AssertionError, match="systematic relative error"):
            G.assert_kernel_matches(sparse_mla_decode_reference(*args, sinks=sinks, **scaled), args, sinks, **scales)
        checked.add((T, width))
    assert len(checked) >= 8 and {w for _, w in checked} == {128, 640}, checked


# Review addition: a sparse-layout argument is refused with a TypeError naming it (a CSR tensor's is_contiguous()
# raised a RuntimeError naming nothing).
@pytest.mark.parametrize("name", ("swa_kv", "compressed_kv", "indices", "lens", "sinks", "out"))
def test_host_op_rejects_sparse_layouts(name):
    from runtime import sparse_mla

    def to_sparse(t):
        try:
            return t.to_sparse_csr()  # the pools and indices: CSR
        except (RuntimeError, IndexError, NotImplementedError):
            return t.to_sparse()  # 1-D and 3-D ones: COO

    for fn in (sparse_mla.sparse_mla_decode, sparse_mla.supports_sparse_mla):
        with pytest.raises(TypeError, match=rf"^{name} must be a dense \(strided\) tensor"):
            _call_with(fn, name, to_sparse)


def _nested(t):
    """``t`` as the one component of a strided-layout nested tensor (torch warns that the layout is a prototype)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([t], layout=torch.strided)


# Review addition (fifty-first session): a nested tensor (its shape raised torch's internal error, naming nothing) and a
# lazily negated view (its memory holds the values un-negated, and the kernel reads the memory) are refused naming them.
# (torch builds no nested FP8 tensor: q and the pools are checked negated only.)
@pytest.mark.parametrize("name,mutate", [(n, torch._neg_view) for n in (*ARGS, "sinks", "out")]
                         + [(n, _nested) for n in ("indices", "lens", "sinks", "out")],
                         ids=lambda v: v if isinstance(v, str) else v.__name__.strip("_"))
def test_host_op_rejects_nested_and_negated_tensors(name, mutate):
    from runtime import sparse_mla

    fix = "allocate out as a plain dense tensor" if name == "out" else f"{name}.resolve_neg"  # out: no copy
    for fn in (sparse_mla.sparse_mla_decode, sparse_mla.supports_sparse_mla):
        with pytest.raises(TypeError, match=rf"^{name} (must be a dense \(strided\) tensor, got a nested|is a lazily "
                                            rf"negated view.*{fix})"):
            _call_with(fn, name, mutate)


def test_fallback_output_carries_no_autograd_graph():
    """The op has no backward; its kernel's output carries no graph. The exact fallback's did where sinks or q
    required grad (a grad_fn through the reference), and an ``out`` that required grad was refused by torch only
    after the whole reference had run. Both paths now write plain values, equal to the reference's."""
    args, kw = _valid_call()
    want = sparse_mla_decode_reference(*args, sinks=kw["sinks"], bmm1_scale=kw["bmm1_scale"],
                                       bmm2_scale=kw["bmm2_scale"])
    from runtime.sparse_mla import sparse_mla_decode

    kw["sinks"] = kw["sinks"].clone().requires_grad_()
    got = sparse_mla_decode(*args, **{**kw, "out": None})
    assert got.grad_fn is None and not got.requires_grad and torch.equal(got, want)
    out = torch.empty_like(want).requires_grad_()
    assert sparse_mla_decode(*args, **{**kw, "out": out}) is out
    assert out.grad_fn is None and torch.equal(out.detach(), want)


def test_max_tokens_and_load_take_device_indices_only(monkeypatch):
    """max_tokens(640, device=True) asked about cuda:1 (a bool is an int to torch.device), and runtime.load(device=1.7)
    loaded device 1 (int()): both are refused naming the device, as a string that names no device is. A device of
    another type has no kernel (max_tokens 0; runtime.load refuses it), and 'cuda' is the current device."""
    import runtime
    from runtime import sparse_mla

    asked = []
    monkeypatch.setattr(sparse_mla, "_held_kernel", lambda width, sinks, device: asked.append(device))
    monkeypatch.setattr(sparse_mla.torch.cuda, "current_device", lambda: 5)
    monkeypatch.setattr(sparse_mla.torch.cuda, "is_available", lambda: True)
    # Each refusal's type and words, not any TypeError or ValueError that says "device: ": a negative index was not
    # asked at all, and whole_number in place of whole_count sent -1 on to torch.device("cuda", -1), whose
    # RuntimeError names no argument.
    refusals = [(True, TypeError, r"^device: expected an integer, got the bool True$"),
                (1.7, TypeError, r"^device: expected an integer, got float 1\.7; pass a whole count$"),
                ("1", ValueError, r"^device: '1' names no device; pass an index or 'cuda:i'$"),
                (-1, ValueError, r"^device: expected an integer >= 0, got -1$"),
                ("gpu7", ValueError, r"^device: 'gpu7' names no device"),
                ("cuda:-1", ValueError, r"^device: 'cuda:-1' names no device"),
                # torch holds an index in 8 signed bits: 256 and 'cuda:256' were cuda:0, 128 cuda:-128, 2**63 an
                # OverflowError-like ValueError naming nothing.
                (128, ValueError, r"^device: device index 128 is past what torch holds .* from 0 to 127$"),
                (256, ValueError, r"^device: device index 256 is past what torch holds"),
                (2**63, ValueError, r"^device: device index 9223372036854775808 is past what torch holds"),
                ("cuda:256", ValueError, r"^device: 'cuda:256' names a device index torch cannot hold \(it reads it "
                                         r"as cuda:0\); pass an index from 0 to 127$"),
                # torch reads 'cuda:255' as no index at all (the current device), and holds cuda:200 as -56
                ("cuda:255", ValueError, r"^device: 'cuda:255' names a device index torch cannot hold \(it reads it "
                                         r"as cuda\)"),
                (torch.device("cuda", 200), ValueError, r"^device: cuda:-56 is a wrapped device index")]
    for device, kind, said in refusals:
        with pytest.raises(kind, match=said):
            sparse_mla.max_tokens(640, device)
    assert asked == []
    assert sparse_mla.max_tokens(640, "meta") == 0 and asked == []
    for device, index in ((2, 2), ("cuda:3", 3), (torch.device("cuda", 1), 1), ("cuda", 5), (127, 127),
                          ("cuda:127", 127)):
        sparse_mla.max_tokens(640, device)
        assert asked.pop() == torch.device("cuda", index)
    # Where torch sees no CUDA device, 'cuda' is cuda:0, which the cache then refuses as it would the index 0:
    # torch.cuda.current_device() failed torch's own assertion there.
    monkeypatch.setattr(sparse_mla.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sparse_mla.torch.cuda, "current_device", lambda: pytest.fail("asked the current device"))
    sparse_mla.max_tokens(640, "cuda")
    assert asked.pop() == torch.device("cuda", 0)
    monkeypatch.setattr(runtime.loader.torch.cuda, "is_available", lambda: True)
    not_cuda = r"^device: runtime\.load loads kernels for a CUDA device; pass its index or 'cuda:i'$"
    for device, kind, said in refusals + [("cpu", ValueError, not_cuda)]:
        with pytest.raises(kind, match=said):
            runtime.load(device=device)


@pytest.mark.parametrize("width", [128, 640])
def test_p_rounding_check_tells_e4m3_from_e5m2(width):
    """The GPU tests' check of how coarsely the kernel rounds P (test_sparse_mla_gpu.p_rounding_ratio), on its own
    inputs on the CPU: an E4M3 emulation whose every score is off within the FP8 accumulator's bound (what a right
    kernel may do) passes it, an E5M2 one fails it. The elementwise budget alone passes both."""
    import test_sparse_mla_gpu as gpu_tests

    args, sinks = gpu_tests.make_case(12, width, seed=7, device="cpu")
    kw = {"sinks": sinks, "bmm1_scale": gpu_tests.BMM1_SCALE, "bmm2_scale": gpu_tests.BMM2_SCALE}
    right = gpu_tests.emulate(*args, score_noise=torch.Generator().manual_seed(1), **kw)
    coarse = gpu_tests.emulate(*args, p_dtype=torch.float8_e5m2, **kw)
    checked = gpu_tests.assert_matches(coarse, args, sinks)  # the elementwise budget: E5M2 passes
    ratio_right, tokens = gpu_tests.p_rounding_ratio(right, checked)
    ratio_coarse, _ = gpu_tests.p_rounding_ratio(coarse, checked)
    assert tokens >= 6
    assert ratio_right <= 1.1 < gpu_tests.P_ROUNDING_RATIO_MAX < 1.6 <= ratio_coarse, (ratio_right, ratio_coarse)


def stand_in_launch(monkeypatch, record):
    """sparse_mla_decode's kernel and launch stood in (the CPU has no kernel to run): returns the list that each
    launch appends ``record(grid, args)`` to."""
    from runtime import sparse_mla

    class Kernel:
        def in_stream_order(self):
            return self

    launched = []
    monkeypatch.setattr(sparse_mla, "_kernel", lambda width, sinks, device: Kernel())
    monkeypatch.setattr(sparse_mla, "launch_on",
                        lambda device, kernel, grid, *args: launched.append(record(grid, args)))
    return launched


def test_kernel_write_bumps_outs_version(monkeypatch):
    """The kernel writes out through its pointer, which autograd cannot see: the op bumps out's version counter, as
    the fallback's copy_ and torch's in-place ops do, so a backward pass over values saved from out before the call
    raises instead of using the overwritten ones. (The launch is stood in: the CPU has no kernel to run.)"""
    from runtime import sparse_mla

    launched = stand_in_launch(monkeypatch, lambda grid, args: grid)
    q, swa, comp, idx, lens = make_inputs(3, 640, seed=5)
    out = torch.zeros(3, H, 512, dtype=torch.bfloat16)
    weight = torch.ones(512, dtype=torch.bfloat16, requires_grad=True)
    saved = (out * weight).sum()  # autograd keeps out for weight's gradient
    before = out._version
    assert sparse_mla.sparse_mla_decode(q, swa, comp, idx, lens, bmm1_scale=0.04, bmm2_scale=1.0, out=out) is out
    assert launched == [3 * 5] and out._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()
    with torch.inference_mode():
        buffer = torch.zeros(3, H, 512, dtype=torch.bfloat16)  # a serving engine's buffer: no counter to bump
    sparse_mla.sparse_mla_decode(q, swa, comp, idx, lens, bmm1_scale=0.04, bmm2_scale=1.0, out=buffer, pdl=False)
    assert launched == [15, 15]


@pytest.mark.parametrize("empty", ("swa_kv", "compressed_kv"))
def test_an_empty_pool_at_an_odd_byte_offset_reaches_the_kernel_aligned(monkeypatch, empty):
    """The alignment check skips an empty tensor (it is never read), but the kernel still forms each masked row's
    cp.async source address from an empty pool's pointer (16 bytes, source size 0), which PTX requires 16-byte aligned.
    That holds because torch gives every empty tensor data_ptr 0, a view of a storage sliced at an odd byte included:
    this pins it. (The launch is stood in: the CPU has no kernel to run.)"""
    from runtime import sparse_mla

    launched = stand_in_launch(monkeypatch, lambda grid, args: args)
    q, swa, comp, idx, lens = make_inputs(2, 640, seed=6)
    raw = torch.zeros(1024, dtype=torch.uint8)
    odd = raw[3:3].view(FP8).view(0, 512)  # an empty pool cut 3 bytes into a buffer
    assert odd.storage_offset() == 3 and odd.is_contiguous()
    pools = {"swa_kv": swa, "compressed_kv": comp, empty: odd}
    sparse_mla.sparse_mla_decode(q, pools["swa_kv"], pools["compressed_kv"], idx, lens, bmm1_scale=0.04,
                                 bmm2_scale=1.0)
    (args,) = launched
    # (out, q, swa_kv, compressed_kv, indices, lens, sinks, swa_rows, compressed_rows, bmm1_scale, bmm2_scale)
    pointer, rows = {"swa_kv": (2, 7), "compressed_kv": (3, 8)}[empty]
    assert args[rows] == 0 and args[pointer] % 16 == 0, (args[rows], args[pointer])


def test_reference_refuses_sinks_of_another_shape():
    """sinks of another length than the heads raised torch's view error (8 sinks), naming no argument."""
    q, swa, comp, idx, lens = make_inputs(2, 128, seed=9)
    for bad in (torch.zeros(8), torch.zeros(1, H), torch.zeros(2 * H)):
        with pytest.raises(ValueError, match=r"sinks must be \[heads\] = \[16\]"):
            sparse_mla_decode_reference(q, swa, comp, idx, lens, sinks=bad, bmm1_scale=0.04, bmm2_scale=1.0)
