"""sparse_mla_decode on the GPU: the AOT cluster kernel and the Triton peer against the torch reference.

Inputs mix, token by token: random ``lens`` with 0 and full ones, scattered -1, whole 128-column
chunks masked, indices at and past each pool's end, duplicate indices, and tokens whose queries
are large enough to make the softmax a near one-hot (scores in the hundreds). The output is filled
with NaN before each run, so any element the kernel fails to write fails the test.

Tolerance (``assert_matches``), per output element: the reference computes in FP32 on the
dequantized FP8 inputs (its two products accumulated in FP64). A kernel of this shape legitimately loses precision in two places:
- P is rounded before the second product (at worst to FP8 E4M3, scaled by 256, per 128-column
  chunk, as the sm_100a original does). ``emulate`` is that same-precision computation in torch;
  its largest error on the token, ``e``, enters as ``3 e``. Where a few columns carry the weight
  (large-magnitude queries, duplicate rows) the error depends on how those few weights happen to
  round, which one emulation does not sample reliably, so the term is at least the analytic
  bound of ``rounding_bounds`` (half an E4M3 unit on every weight).
- FP8 tensor-core products accumulate with about 14 significant bits on Hopper (DeepSeek-V3
  report): each score is off by up to 2^-13 of the sum of its products' magnitudes; its
  first-order effect on the output (``rounding_bounds``) enters twice.
- The AOT kernel's chunks exchange their scaled partial outputs as FP16 (width 640): half an
  FP16 unit (2^-11 relative, with 2^-4 of slack for P's own rounding) on each chunk's partial,
  i.e. at most ``2^-11 (1 + 2^-4) |bmm2_scale| sum_c p_c |kv_c|`` on an output element.
Plus one BF16 rounding of the output (2^-8 of the token's largest output). The same terms bound
the Frobenius norm of the whole error. Tokens without an active column must be exactly zero.
"""

from __future__ import annotations

from typing import NamedTuple

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
ACCUMULATOR_REL = 2.0 ** -13  # Hopper's FP8 MMA accumulator: about 14 significant bits
# The AOT kernel's cluster partials (kernels/sparse_mla_decode.py): FP16, half a unit relative.
KERNEL_PARTIAL_REL = 2.0 ** -11 * (1 + 2.0 ** -4)


def make_case(T: int, width: int, *, seed: int, device="cuda", swa_rows: int = SWA_ROWS, comp_rows: int = COMP_ROWS):
    """Inputs whose tokens cycle through the masking patterns listed in the module docstring."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(T, H, D, generator=g)
    big = torch.arange(T) % 5 == 3  # large-magnitude queries: scores in the hundreds
    q[big] *= 40.0
    q = q.clamp(-448, 448).to(FP8)
    swa = torch.randn(swa_rows, D, generator=g).to(FP8)
    comp = torch.randn(comp_rows, D, generator=g).to(FP8)
    idx = torch.randint(0, swa_rows, (T, width), generator=g, dtype=torch.int32)
    if width > 128:
        idx[:, 128:] = torch.randint(0, comp_rows, (T, width - 128), generator=g, dtype=torch.int32)
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
            rows = torch.where(torch.arange(width) < 128, swa_rows, comp_rows).to(torch.int32)
            idx[t, past] = rows[past] + torch.randint(0, 1 << 20, (int(past.sum()),), generator=g, dtype=torch.int32)
            idx[t, 0] = swa_rows
        elif kind == 5:
            lens[t] = width
            idx[t, 1::2] = idx[t, 0::2]  # duplicates (same pool: chunks are 128 columns, even)
        # kind 6: random lens, plain
    sinks = torch.randn(H, generator=g) * 2.0
    sinks[0] = 30.0  # one head whose sink outweighs most scores
    to = dict(device=device)
    return (q.to(**to), swa.to(**to), comp.to(**to), idx.to(**to), lens.to(**to)), sinks.to(**to)


def _gather(q, swa_kv, compressed_kv, indices, lens):
    """Active mask [T, width] and the gathered rows [T, width, 512] in FP32 (zeros where masked)."""
    active = sparse_mla_active(indices, lens, swa_kv.shape[0], compressed_kv.shape[0])
    idx = indices.long()
    is_swa = torch.arange(idx.shape[1], device=idx.device) < 128
    safe_s = torch.where(active & is_swa, idx, 0).clamp(max=max(swa_kv.shape[0] - 1, 0))
    safe_c = torch.where(active & ~is_swa, idx, 0).clamp(max=max(compressed_kv.shape[0] - 1, 0))
    kv = torch.where(is_swa[None, :, None], _rows(swa_kv, safe_s), _rows(compressed_kv, safe_c))
    kv = torch.where(active[..., None], kv, 0.0)  # not a product: a masked stand-in row may hold NaN bytes
    return active, kv


def _rows(pool, safe):
    """pool[safe] in FP32 (gathered as bytes); zeros for an empty pool (every column of it is masked)."""
    if pool.shape[0] == 0:
        return torch.zeros(*safe.shape, D, device=pool.device)
    return pool.view(torch.uint8)[safe].view(FP8).float()


def emulate(q, swa_kv, compressed_kv, indices, lens, *, sinks, bmm1_scale, bmm2_scale, p_dtype=FP8,
            score_noise=None):
    """The op with P rounded to ``p_dtype`` (x256 for FP8) per 128-column chunk; FP32 elsewhere. ``score_noise`` (a
    torch.Generator): each score off by a uniform draw within the FP8 accumulator's bound (ACCUMULATOR_REL of the
    sum of its products' magnitudes), as a tensor-core product may be."""
    active, kv = _gather(q, swa_kv, compressed_kv, indices, lens)
    T, width = active.shape
    s = torch.matmul(q.float(), kv.transpose(1, 2)) * bmm1_scale
    if score_noise is not None:
        bound = ACCUMULATOR_REL * abs(bmm1_scale) * torch.matmul(q.float().abs(), kv.abs().transpose(1, 2))
        s = s + bound * (2 * torch.rand(s.shape, generator=score_noise, device="cpu").to(s.device) - 1)
    s = s.masked_fill(~active[:, None, :], float("-inf")).view(T, H, width // 128, 128)
    m_c = s.amax(-1)  # -inf for an all-masked chunk: it takes no part in the merge below
    p = torch.exp(s - torch.where(torch.isfinite(m_c), m_c, 0.0)[..., None])
    scale = 256.0 if p_dtype == FP8 else 1.0
    p_r = (p * scale).to(p_dtype).float() / scale
    o_c = torch.einsum("thcw,tcwd->thcd", p_r, kv.view(T, width // 128, 128, D))
    l_c = p.sum(-1)
    m = m_c.amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.float().view(1, H, 1))
    # A stand-in of 0 for a masked chunk's max once entered this merge: where every active score of a head
    # was below about -88, it won the max and the head's output underflowed to 0 (the reference's is not).
    m = torch.where(torch.isfinite(m), m, 0.0)  # a head with no active column and no sink: w = 0 below
    w = torch.exp(m_c - m)
    denom = (w * l_c).sum(-1)
    if sinks is not None:
        denom = denom + torch.exp(sinks.float().view(1, H) - m.squeeze(-1))
    o = (w[..., None] * o_c).sum(2) * (bmm2_scale / denom.clamp(min=1e-30))[..., None]
    return torch.where(active.any(1)[:, None, None], o, 0.0).to(torch.bfloat16)


def rounding_bounds(q, swa_kv, compressed_kv, indices, lens, *, sinks, bmm1_scale, bmm2_scale, p_dtype=FP8,
                    chunk=4):
    """Bounds [T, 16, 512] of the output error from the accumulator and from P's rounding, and
    ``|bmm2_scale| sum_c p_c |kv_c|`` (what a relative rounding of the chunks' partials scales).

    Accumulator: score c is off by at most ``ACCUMULATOR_REL * bmm1_scale * sum_i |q_i kv_c,i|``
    and the output moves by ``d out / d s_c = p_c (kv_c - out)`` (p normalised with the sink), so
    the bound is ``bmm2_scale * sum_c p_c |ds_c| |kv_c - out|`` (to first order): near zero for a
    head whose softmax is one-hot or flat, largest where a few columns share the weight.
    P's rounding: each weight is off by at most half a unit in its last place, ``u`` relative
    (2^-4 for E4M3), or half the subnormal spacing (2^-10 / 256 of the chunk's largest weight for
    E4M3 x 256), moving the output by that times ``|kv_c|`` at most (``|kv_c - out|`` where the
    kernel sums the rounded weights): the sum of these where few columns carry the weight, and
    six standard deviations of the sum of independent roundings where many do. The columns of a
    chunk that read the same row hold the same weight, so they round alike: n such columns are one
    rounding n times over, n^2 times one column's variance, not n times (the random sweep's pools
    of one to five rows repeat rows by the hundred).
    """
    u = 2.0 ** -4 if p_dtype == FP8 else 2.0 ** -8
    T = q.shape[0]
    acc_bound = torch.zeros(T, H, D, device=q.device)
    p_bound = torch.zeros(T, H, D, device=q.device)
    partial_scale = torch.zeros(T, H, D, device=q.device)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        active, kv = _gather(q[t0:t1], swa_kv, compressed_kv, indices[t0:t1], lens[t0:t1])
        qf = q[t0:t1].float()
        s = (torch.matmul(qf, kv.transpose(1, 2)) * bmm1_scale).masked_fill(~active[:, None, :], float("-inf"))
        ds = ACCUMULATOR_REL * abs(bmm1_scale) * torch.matmul(qf.abs(), kv.abs().transpose(1, 2))
        m = s.amax(-1)
        if sinks is not None:
            m = torch.maximum(m, sinks.float().view(1, H))
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m[..., None])
        denom = p.sum(-1) + (torch.exp(sinks.float().view(1, H) - m) if sinks is not None else 0)
        p = p / denom.clamp(min=1e-30)[..., None]
        o = torch.matmul(p, kv)
        spread = (kv[:, None, :, :] - o[:, :, None, :]).abs()  # [t, H, width, D]
        acc_bound[t0:t1] = abs(bmm2_scale) * torch.einsum("thw,thwd->thd", p * ds, spread)
        spread = torch.maximum(spread, kv.abs()[:, None])
        p_err = torch.maximum(p * u, _subnormal_step(s, m, denom)) if p_dtype == FP8 else p * u
        worst = torch.einsum("thw,thwd->thd", p_err, spread)
        repeats = _same_row_count(indices[t0:t1], active)[:, None]
        variance = torch.einsum("thw,thwd->thd", repeats * p_err ** 2 / 3, spread ** 2)
        p_bound[t0:t1] = abs(bmm2_scale) * torch.minimum(worst, 6 * variance.sqrt())
        partial_scale[t0:t1] = abs(bmm2_scale) * torch.matmul(p, kv.abs())
    return acc_bound, p_bound, partial_scale


def _subnormal_step(s, m, denom):
    """Half the E4M3 subnormal spacing of each weight, normalised as ``p``: 256 exp(s - m_c) rounds to a multiple
    of 2^-9 below 2^-6, i.e. off by up to 2^-18 of its chunk's largest weight exp(m_c - m) / denom."""
    T, _, width = s.shape
    m_c = s.view(T, H, width // 128, 128).amax(-1, keepdim=True)
    chunk_top = torch.exp(m_c - m[..., None, None]).expand(-1, -1, -1, 128).reshape(T, H, width)
    return torch.where(torch.isfinite(s), 2.0 ** -18 * chunk_top / denom.clamp(min=1e-30)[..., None], 0.0)


def _same_row_count(indices, active):
    """[t, width]: how many active columns of each column's 128-column chunk read its row (chunk 0 reads the SWA
    pool, the others the compressed one). A masked column counts itself only (its weight is 0)."""
    T, width = indices.shape
    key = torch.where(active, indices.long(), -1 - torch.arange(width, device=indices.device)).view(T, -1, 128)
    return (key[..., :, None] == key[..., None, :]).sum(-1).view(T, width).float()


def token_terms(ref, emu):
    """Per token: the same-precision emulation's largest error (P's rounding, as it fell in torch) and
    the largest reference output (its BF16 ulp)."""
    return (emu - ref).abs().flatten(1).amax(1), ref.abs().flatten(1).amax(1)


def error_budget(e, top, bounds, *, partial_rel=0.0):
    """Per-element error budget [T, 16, 512] (module docstring) from ``token_terms`` and
    ``rounding_bounds``; ``partial_rel``: relative rounding of the chunks' partials."""
    acc, p_round, partial_scale = bounds
    return (torch.maximum((3 * e)[:, None, None], p_round) + 2 * acc + partial_rel * partial_scale
            + (2**-8 * top + 1e-6)[:, None, None])


# How much larger than the E4M3 emulation's the kernel's error may be, by norm, on the tokens whose error P's rounding
# sets. A CPU simulation of this test's inputs (make_case, T 1 to 200, both widths, three seeds): E4M3 P with every
# score off by a uniform draw within the accumulator's bound 0.99-1.03 x, E5M2 P 1.76-2.21 x (BF16 P 0.12-0.14 x).
# The elementwise budget alone (3 x the token's largest emulation error) let E5M2 P through.
P_ROUNDING_RATIO_MAX = 1.4


def p_rounding_ratio(got, checked) -> tuple[float, int]:
    """(||got - ref|| / ||emulation - ref|| over the tokens whose error P's rounding sets, how many such tokens):
    those whose accumulator bound is at most 3 x their emulation error by norm (a token of scores in the hundreds, a
    near one-hot softmax, is left out: there a few weights' rounding, moved by the tensor cores' score errors, sets
    its error, which one emulation does not sample; in the simulation such tokens' bounds were 7 x their error and
    more, the others' at most 1.33 x)."""
    ref, emu, acc = checked
    emu_err = (emu - ref).flatten(1).norm(dim=1)
    rounding_set = (acc.flatten(1).norm(dim=1) <= 3 * emu_err) & (emu_err > 0)
    n = int(rounding_set.sum())
    if not n:
        return 0.0, 0
    return float((got.float() - ref)[rounding_set].norm() / (emu - ref)[rounding_set].norm()), n


def assert_kernel_matches(got, args, sinks, **scales):
    """assert_matches with the AOT kernel's precision: FP8 P, FP16 cluster partials.

    On CUDA the cache must hold the call's variant: sparse_mla_decode otherwise writes the torch
    reference (silently where a loaded cache lacks the variant), and this would compare it with itself."""
    if got.is_cuda:
        from runtime.sparse_mla import supports_sparse_mla

        assert supports_sparse_mla(*args, sinks=sinks), "the AOT kernel must take this call (not the reference)"
    return assert_matches(got, args, sinks, p_dtype=KERNEL_P_DTYPE, partial_rel=KERNEL_PARTIAL_REL, **scales)


def assert_matches(got, args, sinks, *, p_dtype=FP8, partial_rel=0.0, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE):
    kw = dict(sinks=sinks, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale)
    ref = sparse_mla_decode_reference(*args, **kw).float()
    got = got.float()
    bad = ~torch.isfinite(got)
    assert not bad.any(), (f"{int(bad.sum())} non-finite (unwritten?) elements; (token, head) pairs: "
                           f"{bad.any(-1).nonzero().tolist()[:12]}")
    empty = ~sparse_mla_active(args[3], args[4], args[1].shape[0], args[2].shape[0]).any(1)
    assert (got[empty] == 0).all(), "a token without active columns must be zeros"
    emu = emulate(*args, p_dtype=p_dtype, **kw).float()
    e, top = token_terms(ref, emu)
    acc, p_round, partial_scale = bounds = rounding_bounds(*args, p_dtype=p_dtype, **kw)  # per element
    budget = error_budget(e, top, bounds, partial_rel=partial_rel)
    err = (got - ref).abs()
    over = (err > budget).flatten(1).any(1).nonzero().flatten().tolist()

    def worst(t):
        i = int((err[t] - budget[t]).argmax())
        h, d = divmod(i, D)
        return (f"t={t} h={h} d={d}: err {float(err[t, h, d]):.3g} > max(3 x emulation {float(e[t]):.3g}, "
                f"P bound {float(p_round[t, h, d]):.3g}) + 2 x accumulator {float(acc[t, h, d]):.3g} "
                f"+ partials {partial_rel * float(partial_scale[t, h, d]):.3g} + bf16 ulp of {float(top[t]):.3g}")

    assert not over, "tokens over budget: " + "; ".join(worst(t) for t in over[:6])
    err_norm = float((got - ref).norm())
    limit = (max(3 * float((emu - ref).norm()), float(p_round.norm())) + 2 * float(acc.norm())
             + partial_rel * float(partial_scale.norm()) + 2**-8 * float(ref.norm()) + 1e-6)
    assert err_norm <= limit, f"norm error {err_norm:.3g} > {limit:.3g}"
    # The elementwise budget above (3 x the token's largest emulation error) lets a wrong scale or normalisation of a
    # few percent through; the error's projection on the reference does not. It is the output's systematic relative
    # error, which P's rounding sets for the kernel and the same-precision emulation alike: small over many tokens,
    # up to 0.005 on a call of one or two tokens where the rounding of a handful of weights does not average out.
    # So the kernel's must equal the emulation's, to within bias_limit(active tokens): on the H200 the two differed
    # by at most half of it over the sweep's first 1,371 calls (up to 0.0012 on one or two tokens with sharp scores,
    # 1.8e-4 past 50 tokens; sweep_bias_margin_s48.jsonl), while 0.3 % on bmm2_scale or BF16 rounding toward zero
    # moves it by 0.002 to 0.003.
    bias, emu_bias = _bias(got, ref), _bias(emu, ref)
    limit = bias_limit(int((~empty).sum()))
    assert abs(bias - emu_bias) <= limit, (f"systematic relative error {bias:.3g}, the emulation's {emu_bias:.3g}: "
                                           f"{abs(bias - emu_bias):.3g} apart > {limit:.3g}")
    return Checked(ref, emu, acc)


class Checked(NamedTuple):
    """What assert_matches compared a result with: the reference, the same-precision emulation, and the
    accumulator's per-element bound (``rounding_bounds``)."""

    ref: torch.Tensor
    emu: torch.Tensor
    acc: torch.Tensor


def bias_limit(active_tokens):
    """How far the kernel's systematic error may be from the emulation's: one BF16 unit on one token, shrinking as
    the square root of the tokens (the tensor cores' score errors average out), down to a quarter unit."""
    return max(2.0 ** -10, 2.0 ** -8 / max(active_tokens, 1) ** 0.5)




def _bias(got, ref):
    """The error's projection on the reference, relative to |ref|^2: the output's systematic relative error."""
    return float(((got - ref) * ref).sum() / (ref * ref).sum().clamp(min=1e-30))


def poisoned(T):
    return torch.full((T, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")


@pytest.fixture(autouse=True)
def kernel_launches(monkeypatch):
    """Every sparse_mla_decode call of this module must run the AOT kernel. supports_sparse_mla says only whether the
    cache holds the call's variant, not which branch the op took: a routing change that sent some calls (several
    waves, a capture, an alignment) to the exact reference passed every comparison, the reference meeting itself.
    The op's own binding of the reference is watched (this module's import is another binding), and the launches are
    recorded as (kernel name, grid CTAs) for the tests that check them."""
    from runtime import sparse_mla as op

    fell, launched = [], []
    reference, launch_on = op.sparse_mla_decode_reference, op.launch_on

    def watched_reference(*args, **kw):
        fell.append(tuple(args[0].shape))
        return reference(*args, **kw)

    def recorded_launch(device, kernel, grid, *args):
        launched.append((kernel.name, grid))
        return launch_on(device, kernel, grid, *args)

    monkeypatch.setattr(op, "sparse_mla_decode_reference", watched_reference)
    monkeypatch.setattr(op, "launch_on", recorded_launch)
    yield launched
    assert not fell, f"sparse_mla_decode ran its torch fallback for queries of shape {fell}"


def _max_tokens(width):
    from runtime.sparse_mla import max_tokens

    return max_tokens(width)


T_CASES = (1, 6, 12, 48, 200, "max+1")


@pytest.mark.parametrize("T", T_CASES)
@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_matches_reference(width, with_sinks, T, kernel_launches):
    from runtime.contract.sparse_mla_decode import variant_name
    from runtime.sparse_mla import sparse_mla_decode

    T = _max_tokens(width) + 1 if T == "max+1" else T
    args, sinks = make_case(T, width, seed=1000 * width + T + with_sinks)
    sinks = sinks if with_sinks else None
    out = poisoned(T)
    ret = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    torch.cuda.synchronize()
    assert ret is out
    assert kernel_launches == [(variant_name(width, with_sinks), T * width // 128)], "one launch of every token's CTAs"
    checked = assert_kernel_matches(out, args, sinks)
    ratio, tokens = p_rounding_ratio(out, checked)
    assert tokens, "make_case gives every call a plain token whose error P's rounding sets"
    assert ratio <= P_ROUNDING_RATIO_MAX, (f"error {ratio:.3f} x the E4M3 emulation's on {tokens} tokens: P rounded "
                                           f"more coarsely than E4M3 (E5M2 measures ~2 x)")


@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_single_token_of_every_pattern(width, with_sinks):
    """T = 1 with each of make_case's token patterns. In test_kernel_matches_reference T = 1 is token 0 alone, a
    full plain token: none of lens 0, -1, a whole chunk masked, indices past the pool, duplicates or a
    large-magnitude query ran in a one-cluster launch. Here each of 35 tokens (every pattern, with and without the
    x40 query) is its own launch; the outputs, stacked, are checked as a batch (the bias check is a statistic over
    many tokens: one token's same-precision emulation alone can exceed it) and must equal, bit for bit, the same
    tokens in one 35-token launch (a token's clusters read nothing of another token)."""
    from runtime.sparse_mla import sparse_mla_decode, supports_sparse_mla

    args, sinks = make_case(35, width, seed=35 * width + with_sinks)  # 35 = lcm(7 patterns, 5: the x40 queries)
    sinks = sinks if with_sinks else None
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    singles = []
    for t in range(35):
        one = tuple(a[t:t + 1].clone() if i in (0, 3, 4) else a for i, a in enumerate(args))  # q, indices, lens
        assert supports_sparse_mla(*one, sinks=sinks), "the AOT kernel must take a one-token call"
        singles.append(sparse_mla_decode(*one, out=poisoned(1), **kw))
    batch = sparse_mla_decode(*args, out=poisoned(35), **kw)
    torch.cuda.synchronize()
    stacked = torch.cat(singles)
    assert_kernel_matches(stacked, args, sinks)
    diff = (stacked.view(torch.int16) != batch.view(torch.int16)).flatten(1).any(1).nonzero().flatten().tolist()
    assert not diff, f"tokens whose one-token launch differs from the batched launch: {diff}"


@pytest.mark.parametrize("width", [128, 640])
def test_kernel_allocates_out_and_repeats_exactly(width):
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, width, seed=7)
    a = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    b = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=poisoned(12))
    assert a.dtype == torch.bfloat16 and a.shape == (12, H, D)
    assert torch.equal(a, b), "the kernel must be deterministic"
    assert_kernel_matches(a, args, sinks)


@pytest.mark.parametrize("width", [128, 640])
def test_kernel_in_stream_order_equals_pdl_launch(width):
    """pdl=False launches the same function without programmatic dependent launch: the same bits."""
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, width, seed=8)
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    a = sparse_mla_decode(*args, out=poisoned(12), **kw)
    b = sparse_mla_decode(*args, out=poisoned(12), pdl=False, **kw)
    torch.cuda.synchronize()
    assert torch.equal(a, b)
    assert_kernel_matches(b, args, sinks)


def test_kernel_supports_and_max_tokens():
    """Two CTAs resident per SM (issue 3): at width 128 a token is one CTA, so one wave holds two tokens an SM; at
    width 640 a token's five CTAs form a cluster, which the driver places within one GPC, so one wave holds fewer
    than 2 SMs / 5 clusters but more than one CTA an SM would give."""
    from runtime.sparse_mla import max_tokens, supports_sparse_mla

    for width in (128, 640):
        args, sinks = make_case(4, width, seed=3)
        assert supports_sparse_mla(*args, sinks=sinks)
        assert supports_sparse_mla(*args, sinks=None)  # the no-sinks variants: half the matrix
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert max_tokens(128) == 2 * sms
    assert sms // 5 < max_tokens(640) <= 2 * sms // 5


def test_kernel_under_cuda_graph():
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, 640, seed=11)
    out = poisoned(12)
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    sparse_mla_decode(*args, **kw)  # warm-up outside capture
    torch.cuda.synchronize()
    eager = out.clone()
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sparse_mla_decode(*args, **kw)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager), "the replayed kernel writes what the eager one wrote"
    assert_kernel_matches(out, args, sinks)


def test_kernel_reads_the_pool_rows_topk_pool_rows_maps():
    """The indexer's top-k positions (a random subset of each token's request, fewer than k for one, then -1) mapped
    by runtime.indexer.topk_pool_rows on the GPU into a compressed pool of 64-row pages (shuffled, those past each
    request's length unallocated), behind 128 sliding-window columns: the kernel matches the reference on those
    indices, and the reference on them equals, bit for bit, the reference on a dense copy of each token's keys
    indexed by position: the mapped rows hold the positions' keys."""
    from runtime.indexer import topk_pool_rows
    from runtime.sparse_mla import sparse_mla_decode

    T, k, page, pages = 6, 512, 64, 12
    g = torch.Generator(device="cpu").manual_seed(5)
    pool_pages = T * pages + 5
    perm = torch.randperm(pool_pages, generator=g)[:T * pages].view(T, pages).to(torch.int32)
    seq_lens = torch.randint(k, pages * page + 1, (T,), generator=g)
    seq_lens[0], seq_lens[1] = pages * page, 100  # a full table; fewer positions than k
    table = perm.clone()
    for t in range(T):
        table[t, -(-int(seq_lens[t]) // page):] = -1  # pages past the request's length: unallocated
    topk = torch.full((T, k), -1, dtype=torch.int32)
    for t in range(T):
        n = min(k, int(seq_lens[t]))
        topk[t, :n] = torch.randperm(int(seq_lens[t]), generator=g)[:n].to(torch.int32)
    q = torch.randn(T, H, D, generator=g).clamp(-448, 448).to(FP8)
    swa = torch.randn(300, D, generator=g).to(FP8)
    comp = torch.randn(pool_pages * page, D, generator=g).to(FP8)
    swa_idx = torch.randint(0, 300, (T, 128), generator=g, dtype=torch.int32)
    lens = torch.full((T,), 128 + k, dtype=torch.int32)
    sinks = torch.randn(H, generator=g)

    mapped = topk_pool_rows(topk.cuda(), table.cuda())
    indices = torch.cat([swa_idx.cuda(), mapped], dim=1)
    args = (q.cuda(), swa.cuda(), comp.cuda(), indices, lens.cuda())
    kw = {"sinks": sinks.cuda(), "bmm1_scale": BMM1_SCALE, "bmm2_scale": BMM2_SCALE}
    out = sparse_mla_decode(*args, out=poisoned(T), **kw)
    torch.cuda.synchronize()
    assert torch.equal(mapped.cpu() < 0, topk < 0), "every position on an allocated page is mapped"
    assert_kernel_matches(out, args, kw["sinks"])

    rows_of = comp.view(torch.uint8).view(pool_pages, page, D)
    dense = [rows_of[perm[t].long()].reshape(-1, D)[:int(seq_lens[t])] for t in range(T)]
    starts = torch.tensor([0] + [int(n) for n in seq_lens.cumsum(0)[:-1]], dtype=torch.int32)
    dense_idx = torch.where(topk >= 0, topk + starts[:, None], -1).to(torch.int32)
    dense_args = (args[0], args[1], torch.cat(dense).view(FP8).cuda(),
                  torch.cat([swa_idx, dense_idx], dim=1).cuda(), args[4])
    paged_ref = sparse_mla_decode_reference(*args, **kw)
    assert torch.equal(paged_ref, sparse_mla_decode_reference(*dense_args, **kw))


def test_pdl_chain_under_cuda_graph_reads_the_selection_before_it(monkeypatch, kernel_launches):
    """decode_topk writing the compressed columns of the indices straight into their buffer, then sparse_mla_decode
    reading them, both with programmatic dependent launch: the second kernel's read of what the first wrote is
    ordered only by its dependency wait. Captured into a CUDA graph (the launches become programmatic edges) and
    replayed on new logits, with the selected columns set to -1 before each replay (a read ahead of the selection
    would find them masked): each replay selects the reference's sets, and its output equals an eager launch's on
    the indices the replay left, bit for bit."""
    from runtime import topk
    from runtime.reference import decode_topk_reference
    from runtime.sparse_mla import sparse_mla_decode

    T, width, k = 12, 640, 512
    (q, swa, comp, indices, lens), sinks = make_case(T, width, seed=23)
    g = torch.Generator(device="cpu").manual_seed(24)
    sources = [torch.randn(T, COMP_ROWS, generator=g).cuda() for _ in range(3)]
    ends = torch.randint(0, COMP_ROWS + 1, (T,), generator=g, dtype=torch.int32)
    ends[0], ends[2] = COMP_ROWS, 100  # a whole row, and one of fewer candidates than k (then -1)
    ends = ends.cuda()
    logits = torch.empty(T, COMP_ROWS, device="cuda")
    selected = indices[:, 128:]  # [T, k], row stride 640: decode_topk writes sparse MLA's compressed columns
    out = poisoned(T)
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    monkeypatch.setattr(topk, "decode_topk_reference", lambda *a, **_: pytest.fail("decode_topk ran its fallback"))
    source = sources[0].clone()

    def chain():
        torch.mul(source, 1.0, out=logits)  # a torch kernel (it never releases its dependents early)
        topk.decode_topk(logits, ends, selected)  # pdl=True
        sparse_mla_decode(q, swa, comp, indices, lens, out=out, **kw)  # pdl=True

    chain()  # loads and warms outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for new in sources[1:]:
        source.copy_(new)
        selected.fill_(-1)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = decode_topk_reference(new, ends, k)
        assert torch.equal(selected.sort(dim=1).values, want.sort(dim=1).values), "the replay's selection"
        eager = sparse_mla_decode(q, swa, comp, indices, lens, **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), "the replayed sparse MLA read the selection the replay wrote"
    assert len(kernel_launches) == 4  # the warm-up, the capture and the two eager launches: every one the kernel


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_kernel_inside_torch_compile(backend, kernel_launches):
    """A compiled function (one graph: fullgraph) holds the op as its custom op, whose call launches the kernel: the
    same bits as the eager launch, with out given and allocated."""
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, 640, seed=12)
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    eager = sparse_mla_decode(*args, **kw)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a, out=None: sparse_mla_decode(*a, out=out, **kw).float() * 2.0,
                             backend=backend, fullgraph=True)
    out = poisoned(12)
    given = compiled(*args, out=out)
    allocated = compiled(*args)
    torch.cuda.synchronize()
    assert torch.equal(out, eager), "out written by the compiled call"
    assert torch.equal(given, eager.float() * 2.0) and torch.equal(allocated, eager.float() * 2.0)
    assert len(kernel_launches) == 3, kernel_launches

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


def _triton_failures(tsm, configs, args, sinks):
    """Each config against the reference: a line per failing config."""
    failures = []
    for config in configs:
        out = poisoned(args[0].shape[0])
        tsm.triton_sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE,
                                     out=out, config=config)
        torch.cuda.synchronize()
        try:
            assert_matches(out, args, sinks, p_dtype=FP8 if config.fp8_pv else torch.bfloat16,
                           partial_rel=KERNEL_PARTIAL_REL if config.fp16_partials else 0.0)
        except AssertionError as e:
            failures.append(f"width {args[3].shape[1]} {config}: {str(e).splitlines()[0]}")
    return failures


def _check_triton_configs(tsm, configs, args, sinks):
    failures = _triton_failures(tsm, configs, args, sinks)
    assert not failures, "\n".join(failures)


def test_triton_peer_every_config_runs_right():
    tsm = _triton()
    failures = []
    for width in (128, 640):
        args, sinks = make_case(12, width, seed=5 + width)
        failures += _triton_failures(tsm, tsm.CONFIGS, args, sinks)
    assert not failures, "\n".join(failures)


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
    assert_kernel_matches(out, (q, swa, comp, idx, lens), sinks)


def test_kernel_zero_tokens():
    """T = 0 launches nothing (an empty grid is a launch error) and returns the given out, or a new empty one, on a
    device whose cache takes the call."""
    from runtime.sparse_mla import sparse_mla_decode, supports_sparse_mla

    args, sinks = make_case(1, 640, seed=1)
    args = tuple(a[:0] if i in (0, 3, 4) else a for i, a in enumerate(args))
    assert supports_sparse_mla(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    out = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    assert out.shape == (0, H, D) and out.dtype == torch.bfloat16 and out.is_cuda
    given = poisoned(0)
    assert sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=given) is given


@pytest.mark.parametrize("width", [128, 640])
def test_kernel_sinks_at_the_float32_limits(width):
    """Sinks are device values the host op does not check: +inf, and ones whose base-2 form overflows float32 (the
    kernel folds log2(e) in), take all of their head's weight, zeros as in the reference; -inf weighs nothing. No NaN,
    and every other head is bit for bit what it is with ordinary sinks (heads are independent)."""
    from runtime.sparse_mla import sparse_mla_decode

    args, sinks = make_case(12, width, seed=7 + width)
    extreme = sinks.clone()
    heavy = {2: float("inf"), 5: 3.0e38, 7: torch.finfo(torch.float32).max, 11: 1.0e4}
    for h, v in heavy.items():
        extreme[h] = v
    extreme[9] = float("-inf")
    kw = dict(bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    got = sparse_mla_decode(*args, sinks=extreme, out=poisoned(12), **kw)
    plain = sinks.clone()
    plain[9] = float("-inf")
    base = sparse_mla_decode(*args, sinks=plain, out=poisoned(12), **kw)
    want = sparse_mla_decode_reference(*args, sinks=extreme, **kw)
    torch.cuda.synchronize()
    assert not got.isnan().any()
    rows = list(heavy)
    assert (got[:, rows] == 0).all() and (want[:, rows] == 0).all()
    rest = [h for h in range(H) if h not in heavy]
    assert torch.equal(got[:, rest].view(torch.int16), base[:, rest].view(torch.int16))
    assert_kernel_matches(base, args, plain)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_scores_at_the_bmm1_scale_bound(width, with_sinks, sign):
    """At |bmm1_scale| = 1e30, the host op's bound, the largest E4M3 scores (448^2 * 512, 1.03e8) reach +-1.5e38 in the
    kernel's base 2, half its stand-in for -inf (-3e38); past the bound (scales up to 2.4e38 were taken before) a head
    whose scores all sat below the stand-in came out zero, where the reference is not. The query is 448 everywhere
    and every row -448 but one a pool (+448): token 0 reads only -448 rows (equal scores), tokens 1 and 2 also the
    +448 row (swa_kv's, compressed_kv's at width 640), whose weight is 1 at a positive scale and 0 at a negative one
    (the other chunks' weights vanish in the cluster's merge); sinks 0 take all the weight where every score is
    -1.5e38 and none elsewhere. Kernel and reference equal each other and the output worked out by hand."""
    from runtime.sparse_mla import (
        _BMM1_SCALE_MAX,
        sparse_mla_decode,
        supports_sparse_mla,
    )

    swa = torch.full((256, D), -448.0, device="cuda")
    comp = torch.full((1024, D), -448.0, device="cuda")
    swa[5], comp[1023] = 448.0, 448.0
    q = torch.full((3, H, D), 448.0, device="cuda").to(FP8)
    first = {128: [128, 0, 0], 640: [128, 0, 128]}[width]  # each token's first swa_kv row; compressed_kv's follow
    cols = [torch.arange(f, f + 128, device="cuda") for f in first]
    if width == 640:
        comp_first = [0, 0, 512]
        cols = [torch.cat([c, torch.arange(cf, cf + 512, device="cuda")]) for c, cf in zip(cols, comp_first)]
    indices = torch.stack(cols).to(torch.int32)
    lens = torch.full((3,), width, dtype=torch.int32, device="cuda")
    sinks = torch.zeros(H, device="cuda") if with_sinks else None
    args = (q, swa.to(FP8), comp.to(FP8), indices, lens)
    kw = {"sinks": sinks, "bmm1_scale": sign * _BMM1_SCALE_MAX, "bmm2_scale": 1.0}
    assert supports_sparse_mla(*args, **kw), "the kernel must take the call (else the reference meets itself)"
    got = sparse_mla_decode(*args, out=poisoned(3), **kw)
    want = sparse_mla_decode_reference(*args, **kw)
    if sign > 0:  # token 0's scores all -1.5e38 (the sink, where there is one, takes the weight); the +448 row wins
        by_hand = [0.0 if with_sinks else -448.0, 448.0, 448.0]
    else:  # token 0's scores all +1.5e38; the +448 row scores -1.5e38 among rows at +1.5e38
        by_hand = [-448.0, -448.0, -448.0]
    torch.cuda.synchronize()
    assert not got.isnan().any()
    expected = torch.tensor(by_hand, device="cuda").view(3, 1, 1).expand(3, H, D)
    assert torch.equal(want.float(), expected), "the reference"
    assert torch.equal(got.float(), expected), "the kernel"


@pytest.mark.parametrize("sink", [None, -1000.0])
@pytest.mark.parametrize("masked, want", [(slice(0, 128), 1.5), (slice(256, 384), 0.75)])
def test_kernel_skips_masked_chunks_in_the_merge(sink, masked, want):
    """Width 640 with one 128-column chunk masked whole (the SWA chunk, or compressed chunk 2) and every other column
    on one row: scores of -153.6 (swa_kv's row of ones) and -307.2 (compressed_kv's row of twos). Only the highest
    active chunk counts, bmm2_scale times its row. A masked chunk's stats merged as a max of 0 (not its stand-in for
    -inf) would scale every active chunk by exp(-153.6) or less, an output of 0: the random inputs of the other tests
    differ from such a kernel by a BF16 unit at most (test_sparse_mla_reference.py's
    test_emulation_skips_masked_chunks_in_the_merge guards the emulation the same way)."""
    from runtime.sparse_mla import sparse_mla_decode

    q = torch.ones(1, H, D, device="cuda").to(FP8)
    swa, comp = torch.ones(4, D, device="cuda").to(FP8), torch.full((3, D), 2.0, device="cuda").to(FP8)
    indices = torch.zeros(1, 640, dtype=torch.int32, device="cuda")
    indices[0, masked] = -1
    lens = torch.tensor([640], dtype=torch.int32, device="cuda")
    sinks = None if sink is None else torch.full((H,), sink, device="cuda")
    kw = {"sinks": sinks, "bmm1_scale": -0.3, "bmm2_scale": 0.75}
    got = sparse_mla_decode(q, swa, comp, indices, lens, out=poisoned(1), **kw)
    expected = torch.full((1, H, D), want, device="cuda")
    assert torch.equal(sparse_mla_decode_reference(q, swa, comp, indices, lens, **kw).float(), expected)
    torch.cuda.synchronize()
    assert torch.equal(got.float(), expected), "the kernel"


@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_never_reads_the_row_at_each_pools_end(width, with_sinks):
    """Each pool is the first rows of a larger allocation whose next row is FP8 NaN (0x7F bytes), and a quarter of
    every token's columns index exactly that row (the pool's row count). A kernel masking ``index > rows`` instead of
    ``index >= rows`` would read it and write NaN; make_case's indices past the end land anywhere up to 2^20 rows on,
    where only the allocator's layout decides what an off-by-one reads."""
    from runtime.sparse_mla import sparse_mla_decode

    T = 12
    (q, swa, comp, idx, lens), sinks = make_case(T, width, seed=7 * width + with_sinks)
    sinks = sinks if with_sinks else None
    pools = []
    for pool in (swa, comp):
        buffer = torch.empty(pool.shape[0] + 1, D, dtype=FP8, device="cuda")
        buffer.view(torch.uint8)[-1] = 0x7F  # E4M3 NaN
        buffer[:-1] = pool
        pools.append(buffer[:-1])
    g = torch.Generator(device="cpu").manual_seed(width)
    at_end = (torch.rand(T, width, generator=g) < 0.25).cuda()
    rows = torch.where(torch.arange(width, device="cuda") < 128, swa.shape[0], comp.shape[0]).to(torch.int32)
    idx = torch.where(at_end, rows.expand(T, width), idx)
    args = (q, pools[0], pools[1], idx, lens)
    out = sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=poisoned(T))
    torch.cuda.synchronize()
    assert_kernel_matches(out, args, sinks)  # every element finite, within the reference's budget


def make_edge_case(width: int, *, device="cuda", swa_rows=SWA_ROWS, comp_rows=COMP_ROWS, seed=0):
    """Tokens make_case never draws: lens past the width and negative (the kernel compares lens signed;
    the host op cannot check device values), one or two active columns (a sink, or a spurious one,
    decides the output), indices below -1 (-2, INT32_MIN), INT32_MAX and exactly a pool's row count in
    the compressed columns (the sliding-window ones too). Pools may be empty (a compressed pool at a
    sequence's start)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = 10
    q = torch.randn(T, H, D, generator=g).to(FP8)
    swa = torch.randn(swa_rows, D, generator=g).to(FP8)
    comp = torch.randn(comp_rows, D, generator=g).to(FP8)
    idx = torch.randint(0, max(swa_rows, 1), (T, width), generator=g, dtype=torch.int32)
    if width > 128:
        idx[:, 128:] = torch.randint(0, max(comp_rows, 1), (T, width - 128), generator=g, dtype=torch.int32)
    lens = torch.tensor([width + 1, 2 ** 31 - 1, -1, -(2 ** 31), 1, 2, width, width, width, 130], dtype=torch.int32)
    idx[6, ::3] = -2
    idx[6, 1::3] = -(2 ** 31)
    idx[7, ::2] = 2 ** 31 - 1
    idx[8, 1:128:5] = swa_rows  # exactly the sliding-window pool's end
    if width > 128:
        idx[8, 128::2] = comp_rows  # exactly the compressed pool's end
        idx[9, 0] = -2  # token 9: its only other active column is 129
        idx[9, 1:128] = -1
    sinks = torch.randn(H, generator=g) * 2.0
    sinks[1] = float("-inf")  # a head whose sink weighs nothing
    to = dict(device=device)
    return (q.to(**to), swa.to(**to), comp.to(**to), idx.to(**to), lens.to(**to)), sinks.to(**to)


@pytest.mark.parametrize("pools", ["both", "empty_compressed", "empty_swa"])
@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_edge_inputs(width, with_sinks, pools):
    """The kernel on make_edge_case's inputs (lens past the width and negative, extreme and boundary indices, empty
    pools, one or two active columns, a -inf sink) equals the reference."""
    from runtime.sparse_mla import sparse_mla_decode

    rows = dict(both=(SWA_ROWS, COMP_ROWS), empty_compressed=(SWA_ROWS, 0), empty_swa=(0, COMP_ROWS))[pools]
    args, sinks = make_edge_case(width, swa_rows=rows[0], comp_rows=rows[1],
                                 seed=width + with_sinks)
    sinks = sinks if with_sinks else None
    out = poisoned(args[0].shape[0])
    sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    torch.cuda.synchronize()
    assert_kernel_matches(out, args, sinks)


@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("width", [128, 640])
def test_kernel_never_reads_masked_rows(width, with_sinks):
    """Row 0 of each pool holds NaN bytes and only masked columns (past lens, and the -1 / past-the-pool ones
    make_case draws) name it: the kernel and the reference read no masked row, so the output equals the
    reference's and is finite (an empty token's zeros included)."""
    from runtime.sparse_mla import sparse_mla_decode

    (q, swa, comp, idx, lens), sinks = make_case(14, width, seed=width + 31 * with_sinks)
    idx = torch.where(idx == 0, 1, idx)  # no active column names row 0 ...
    past = torch.arange(width, device=idx.device)[None, :] >= lens[:, None]
    idx = torch.where(past, 0, idx)  # ... while every column past lens does
    for pool in (swa, comp):
        pool.view(torch.uint8)[0] = 0xFF  # E4M3 NaN
    sinks = sinks if with_sinks else None
    args = (q, swa, comp, idx.contiguous(), lens)
    out = poisoned(q.shape[0])
    sparse_mla_decode(*args, sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE, out=out)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    assert_kernel_matches(out, args, sinks)


def test_reference_ignores_lowered_fp32_matmul_precision(fp32_matmul_precision):
    """A process that turns on TF32 (or BF16) for FP32 matmuls does not change the reference, the op's exact
    fallback: its products accumulate in FP64, which has no such mode. Before, both products ran as FP32
    matmuls and rounded their inputs to TF32 here."""
    from runtime import reference

    (q, swa, comp, idx, lens), sinks = make_case(12, 640, seed=77)
    kw = dict(sinks=sinks, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    a = torch.randn(64, 512, device="cuda")
    b = torch.randn(512, 640, device="cuda")
    fp32_matmul_precision("highest")
    ieee = sparse_mla_decode_reference(q, swa, comp, idx, lens, **kw), reference._products(a, b)
    fp32 = torch.matmul(a, b)
    for precision in ("high", "medium"):
        fp32_matmul_precision(precision)
        assert not torch.equal(torch.matmul(a, b), fp32), "the setting should lower FP32 matmuls"
        lowered = sparse_mla_decode_reference(q, swa, comp, idx, lens, **kw), reference._products(a, b)
        assert torch.equal(lowered[0], ieee[0]) and torch.equal(lowered[1], ieee[1]), precision


# A seeded sweep of random calls: T (0 to past one wave), width, sinks on or off, pool sizes down to one row (so that
# "at or past the pool's end" falls on small indices too) and both scales' signs and sizes drawn at random, each
# checked as test_kernel_matches_reference checks. The count: a quarter of conftest.py's fuzz_cases (each call is a
# batch of tokens).


def fuzz_draw(rng, max_tokens):
    """One call of the random sweep from ``rng`` (a random.Random): (T, width, (swa_rows, comp_rows), with_sinks,
    scales); ``max_tokens(width)`` is one wave's tokens (test_sparse_mla_reference.py draws the same calls on the CPU
    with the H200's)."""
    width = rng.choice((128, 640))
    T = rng.choice((0, 1, 2, 5, 11, 13, 47, 48, 64, 100, max_tokens(width), max_tokens(width) + 1))
    pools = rng.choice((1, 2, 127, 128, 129, 3000)), rng.choice((1, 5, 511, 512, 20000))
    with_sinks = rng.random() < 0.5
    scales = {"bmm1_scale": BMM1_SCALE * rng.choice((1.0, 0.25, 3.0, -1.0)),
              "bmm2_scale": BMM2_SCALE * rng.choice((1.0, -2.0, 0.1))}
    return T, width, pools, with_sinks, scales


FUZZ_SEED = 47  # the sweep's random.Random; make_case's seed is FUZZ_CASE_SEED + the call's number
FUZZ_CASE_SEED = 10_000


def fuzz_case(i, draw, device="cuda"):
    """The inputs (args, sinks or None) of the sweep's call number ``i``, drawn as ``draw`` (fuzz_draw's tuple)."""
    T, width, (swa_rows, comp_rows), with_sinks, _ = draw
    args, sinks = make_case(T, width, seed=FUZZ_CASE_SEED + i, device=device, swa_rows=swa_rows, comp_rows=comp_rows)
    return args, sinks if with_sinks else None


def test_random_calls_match_the_reference(fuzz_cases):
    import random

    from runtime.sparse_mla import sparse_mla_decode

    rng = random.Random(FUZZ_SEED)
    cases = max(1, fuzz_cases // 4)
    bad = []
    for i in range(cases):
        T, width, (swa_rows, comp_rows), with_sinks, scales = draw = fuzz_draw(rng, _max_tokens)
        args, sinks = fuzz_case(i, draw)
        out = poisoned(T)
        ret = sparse_mla_decode(*args, sinks=sinks, out=out, **scales)
        torch.cuda.synchronize()
        try:
            assert ret is out and out.shape == (T, H, D)
            if T:
                assert_kernel_matches(out, args, sinks, **scales)
        except AssertionError as e:
            bad.append(f"case {i} (T={T} width={width} pools={swa_rows},{comp_rows} sinks={with_sinks} "
                       f"scales={scales}): {str(e)[-300:]}")
    assert not bad, (len(bad), bad[:4])
