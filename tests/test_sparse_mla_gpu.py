"""sparse_mla_decode on the GPU: the AOT cluster kernel and the Triton peer against the torch reference.

Inputs mix, token by token: random ``lens`` with 0 and full ones, scattered -1, whole 128-column
chunks masked, indices at and past each pool's end, duplicate indices, and tokens whose queries
are large enough to make the softmax a near one-hot (scores in the hundreds). The output is filled
with NaN before each run, so any element the kernel fails to write fails the test.

Tolerance (``assert_matches``): the reference computes in FP32 on the dequantized FP8 inputs. A
kernel of this shape legitimately loses precision in two places: FP8 tensor-core products
accumulate with about 14 significant bits on Hopper (DeepSeek-V3 report), and the softmax weights
P are rounded before the second product (at worst to FP8 E4M3, scaled by 256, per 128-column
chunk, as the sm_100a original does). ``emulate`` is that same-precision computation in torch: P
rounded the kernel's way, and each score perturbed by a random fraction of 2^-13 times the sum of
its products' magnitudes (the accumulator's rounding). Where a softmax is nearly one-hot (the
large-magnitude tokens) the error depends on how the few large weights happen to round, so ``e``
is the largest error against the FP32 reference over ``EMULATIONS`` such draws. Per token, the
kernel's largest error may be at most ``3 e`` plus one BF16 rounding of the output (2^-8 of the
token's largest output); the same holds for the whole output in the Frobenius norm. Tokens
without an active column must be exactly zero.
"""

from __future__ import annotations

import pytest
import torch

from runtime.reference import sparse_mla_active, sparse_mla_decode_reference

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
H, D = 16, 512
SWA_ROWS, COMP_ROWS = 3000, 20000
BMM1_SCALE = 2.0 / 512 ** 0.5  # unit-variance q and rows: scores with a standard deviation of 2 (80 for the x40 tokens)
BMM2_SCALE = 0.75
# The P type the AOT kernel's second product uses (read from kernels/sparse_mla_decode.py); the
# tolerance of the kernel tests is that of a torch computation rounding P the same way.
KERNEL_P_DTYPE = FP8
EMULATIONS = 4  # random draws of the accumulator's rounding in the emulation
ACCUMULATOR_REL = 2.0 ** -13


def make_case(T: int, width: int, *, seed: int, device="cuda"):
    """Inputs whose tokens cycle through the masking patterns listed in the module docstring."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(T, H, D, generator=g)
    big = torch.arange(T) % 5 == 3  # large-magnitude queries: scores in the hundreds
    q[big] *= 40.0
    q = q.clamp(-448, 448).to(FP8)
    swa = torch.randn(SWA_ROWS, D, generator=g).to(FP8)
    comp = torch.randn(COMP_ROWS, D, generator=g).to(FP8)
    idx = torch.randint(0, SWA_ROWS, (T, width), generator=g, dtype=torch.int32)
    if width > 128:
        idx[:, 128:] = torch.randint(0, COMP_ROWS, (T, width - 128), generator=g, dtype=torch.int32)
    lens = torch.randint(0, width + 1, (T,), generator=g, dtype=torch.int32)
    chunks = width // 128
    for t in range(T):
        kind = t % 7
        if kind == 0:
            lens[t] = width  # full
        elif kind == 1:
            lens[t] = 0  # empty token
        elif kind == 2:
            lens[t] = width
            idx[t, torch.rand(width, generator=g) < 0.1] = -1  # scattered -1
        elif kind == 3:
            lens[t] = width
            j = int(torch.randint(0, chunks, (1,), generator=g))
            idx[t, 128 * j:128 * (j + 1)] = -1  # a whole chunk masked
        elif kind == 4:
            lens[t] = max(int(lens[t]), 1)
            past = torch.rand(width, generator=g) < 0.15  # indices at and past the pool's end
            rows = torch.where(torch.arange(width) < 128, SWA_ROWS, COMP_ROWS).to(torch.int32)
            idx[t, past] = rows[past] + torch.randint(0, 1 << 20, (int(past.sum()),), generator=g, dtype=torch.int32)
            idx[t, 0] = SWA_ROWS
        elif kind == 5:
            lens[t] = width
            idx[t, 1::2] = idx[t, 0::2]  # duplicates (same pool: chunks are 128 columns, even)
        # kind 6: random lens, plain
    sinks = torch.randn(H, generator=g) * 2.0
    sinks[0] = 30.0  # one head whose sink outweighs most scores
    to = dict(device=device)
    return (q.to(**to), swa.to(**to), comp.to(**to), idx.to(**to), lens.to(**to)), sinks.to(**to)


def emulate(q, swa_kv, compressed_kv, indices, lens, *, sinks, bmm1_scale, bmm2_scale, p_dtype=FP8, seed=0):
    """The op with Hopper's FP8 accumulator rounding drawn at random (``seed``) and P rounded to
    ``p_dtype`` (x256 for FP8) per 128-column chunk; FP32 elsewhere."""
    active = sparse_mla_active(indices, lens, swa_kv.shape[0], compressed_kv.shape[0])
    idx = indices.long()
    T, width = idx.shape
    is_swa = torch.arange(width, device=idx.device) < 128
    safe_s = torch.where(active & is_swa, idx, 0).clamp(max=max(swa_kv.shape[0] - 1, 0))
    safe_c = torch.where(active & ~is_swa, idx, 0).clamp(max=max(compressed_kv.shape[0] - 1, 0))
    kv = torch.where(is_swa[None, :, None], swa_kv.view(torch.uint8)[safe_s].view(FP8).float(),
                     compressed_kv.view(torch.uint8)[safe_c].view(FP8).float()) * active[..., None]
    qf = q.float()
    s = torch.matmul(qf, kv.transpose(1, 2)) * bmm1_scale
    g = torch.Generator(device=s.device).manual_seed(seed)
    magnitude = torch.matmul(qf.abs(), kv.abs().transpose(1, 2)) * abs(bmm1_scale)
    s = s + ACCUMULATOR_REL * magnitude * (torch.rand(s.shape, generator=g, device=s.device) * 2 - 1)
    s = s.masked_fill(~active[:, None, :], float("-inf")).view(T, H, width // 128, 128)
    m_c = s.amax(-1, keepdim=True)
    m_c = torch.where(torch.isfinite(m_c), m_c, torch.zeros_like(m_c))
    p = torch.exp(s - m_c)
    scale = 256.0 if p_dtype == FP8 else 1.0
    p_r = (p * scale).to(p_dtype).float() / scale
    o_c = torch.einsum("thcw,tcwd->thcd", p_r, kv.view(T, width // 128, 128, D))
    l_c = p.sum(-1)
    m = m_c.squeeze(-1).amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.float().view(1, H, 1))
    w = torch.exp(m_c.squeeze(-1) - m)
    denom = (w * l_c).sum(-1)
    if sinks is not None:
        denom = denom + torch.exp(sinks.float().view(1, H) - m.squeeze(-1))
    o = (w[..., None] * o_c).sum(2) * (bmm2_scale / denom.clamp(min=1e-30))[..., None]
    return (o * active.any(1)[:, None, None]).to(torch.bfloat16)


def assert_matches(got, args, sinks, *, p_dtype=FP8):
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    ref = sparse_mla_decode_reference(*args, **kw).float()
    got = got.float()
    bad = ~torch.isfinite(got)
    assert not bad.any(), (f"{int(bad.sum())} non-finite (unwritten?) elements; (token, head) pairs: "
                           f"{bad.any(-1).nonzero().tolist()[:12]}")
    empty = ~sparse_mla_active(args[3], args[4], args[1].shape[0], args[2].shape[0]).any(1)
    assert (got[empty] == 0).all(), "a token without active columns must be zeros"
    err = (got - ref).abs().flatten(1).amax(1)  # per token
    e = torch.zeros_like(err)
    e_norm = 0.0
    for seed in range(EMULATIONS):
        emu = emulate(*args, p_dtype=p_dtype, seed=seed, **kw).float()
        e = torch.maximum(e, (emu - ref).abs().flatten(1).amax(1))
        e_norm = max(e_norm, float((emu - ref).norm()))
    top = ref.abs().flatten(1).amax(1)
    budget = 3 * e + 2**-8 * top + 1e-6
    bad = (err > budget).nonzero().flatten().tolist()
    assert not bad, "tokens over budget: " + ", ".join(
        f"t={t} err {float(err[t]):.3g} > 3 x emulation {float(e[t]):.3g} + bf16 ulp of {float(top[t]):.3g}" for t in bad[:8])
    err_norm = float((got - ref).norm())
    assert err_norm <= 3 * e_norm + 2**-8 * float(ref.norm()) + 1e-6, f"norm error {err_norm:.3g} vs emulation {e_norm:.3g}"


def poisoned(T):
    return torch.full((T, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")


def _max_tokens(width):
    from runtime.sparse_mla import max_tokens

    return max_tokens(width)


T_CASES = (1, 6, 12, 48, 200, "max+1")


@pytest.mark.parametrize("T", T_CASES)
@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_matches_reference(width, with_sinks, T):
    from runtime.sparse_mla import sparse_mla_decode

    T = _max_tokens(width) + 1 if T == "max+1" else T
    args, sinks = make_case(T, width, seed=1000 * width + T + with_sinks)
    sinks = sinks if with_sinks else None
    out = poisoned(T)
    ret = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    torch.cuda.synchronize()
    assert ret is out
    assert_matches(out, args, sinks, p_dtype=KERNEL_P_DTYPE)


@pytest.mark.parametrize("width", [128, 640])
def test_kernel_allocates_out_and_repeats_exactly(width):
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, width, seed=7)
    a = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    b = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=poisoned(12))
    assert a.dtype == torch.bfloat16 and a.shape == (12, H, D)
    assert torch.equal(a, b), "the kernel must be deterministic"
    assert_matches(a, args, sinks, p_dtype=KERNEL_P_DTYPE)


def test_kernel_supports_and_max_tokens():
    from runtime.sparse_mla import max_tokens, supports_sparse_mla

    for width in (128, 640):
        assert max_tokens(width) >= 1
        args, sinks = make_case(4, width, seed=3)
        assert supports_sparse_mla(*args, sinks=sinks)
    assert max_tokens(128) >= max_tokens(640)


def test_kernel_under_cuda_graph():
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, 640, seed=11)
    out = poisoned(12)
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    sparse_mla_decode(*args, **kw)  # warm-up outside capture
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sparse_mla_decode(*args, **kw)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert_matches(out, args, sinks, p_dtype=KERNEL_P_DTYPE)


# --- the Triton peer of the benchmark: it must be right to be a fair peer -------------------------

def _triton():
    pytest.importorskip("triton")
    from benchmarks import triton_sparse_mla

    return triton_sparse_mla


@pytest.mark.parametrize("T", (1, 12, 48, 200))
@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_triton_peer_matches_reference(width, with_sinks, T):
    tsm = _triton()
    args, sinks = make_case(T, width, seed=7 * width + T + with_sinks)
    sinks = sinks if with_sinks else None
    _check_triton_configs(tsm, (tsm.DEFAULT, tsm.Config(block_n=32, tiles=4, num_stages=3, num_warps=8),
                                tsm.Config(block_n=64, tiles=2, num_warps=8, fp8_pv=True, kv_major=True)),
                          args, sinks)


def _check_triton_configs(tsm, configs, args, sinks):
    """Every config against the reference; one failure report naming each failing config."""
    failures = []
    for config in configs:
        out = poisoned(args[0].shape[0])
        tsm.triton_sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE,
                                     out=out, config=config)
        torch.cuda.synchronize()
        try:
            assert_matches(out, args, sinks, p_dtype=FP8 if config.fp8_pv else torch.bfloat16)
        except AssertionError as e:
            failures.append(f"{config}: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_triton_peer_every_config_runs_right():
    tsm = _triton()
    for width in (128, 640):
        args, sinks = make_case(12, width, seed=5 + width)
        _check_triton_configs(tsm, tsm.CONFIGS, args, sinks)


def test_kernel_with_small_tensors_only_4_byte_aligned():
    # The host op accepts indices, lens and sinks at any 4-byte aligned address: the kernel must
    # then read them right (no 16-byte vector access assumed).
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(6, 640, seed=21)
    q, swa, comp, idx, lens = args

    def shifted(t):
        raw = torch.empty(t.numel() + 8, dtype=t.dtype, device="cuda")
        start = next(i for i in range(1, 5) if (raw.data_ptr() + 4 * i) % 16)
        view = raw[start:start + t.numel()].view(t.shape)
        view.copy_(t)
        return view

    idx, lens, sinks = shifted(idx), shifted(lens), shifted(sinks)
    assert idx.data_ptr() % 16 and lens.data_ptr() % 16 and sinks.data_ptr() % 16
    out = poisoned(6)
    sparse_mla_decode(q, swa, comp, idx, lens, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    torch.cuda.synchronize()
    assert_matches(out, (q, swa, comp, idx, lens), sinks, p_dtype=KERNEL_P_DTYPE)


def test_kernel_zero_tokens():
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(1, 640, seed=1)
    args = tuple(a[:0] if i in (0, 3, 4) else a for i, a in enumerate(args))
    out = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    assert out.shape == (0, H, D)
