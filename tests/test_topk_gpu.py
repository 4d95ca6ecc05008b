"""decode_topk cluster kernel vs the exact reference on a GPU (marker gpu).

Every case checks, per row: the selected set equals the reference's (which is
exact for ties: lower index first), no index repeats, every index is a candidate,
and every selected key is >= the k-th best key. Each case first asserts that the
kernel (not the torch fallback) takes it.
"""

from contextlib import nullcontext

import pytest
import torch

pytestmark = pytest.mark.gpu

KS = (512, 1024, 2048)
ROWS = (1, 8, 14, 64)
DTYPES = (torch.float32, torch.bfloat16)


def _lengths(k):
    return (1, k - 1, k, 4096, 65536, 262144, 1 << 20)


def _run(logits, row_ends, k, block_mode, *, expect_kernel=True):
    """decode_topk's rows; where ``expect_kernel``, by the AOT kernel: supports_decode_topk says only that the cache
    holds one, and a routing change could still send the call to the exact fallback, which meets the reference."""
    from unittest import mock

    from runtime import topk
    from runtime.topk import decode_topk, supports_decode_topk

    rows = logits.shape[0]
    if expect_kernel:
        assert supports_decode_topk(logits, rows, k, block_mode), "the kernel should take this case"
    out = torch.full((rows, k), -7, dtype=torch.int32, device=logits.device)
    fallback = AssertionError("decode_topk ran its torch fallback where the kernel should take the case")
    with mock.patch.object(topk, "decode_topk_reference", side_effect=fallback) if expect_kernel else nullcontext():
        decode_topk(logits, row_ends, out, block_mode=block_mode)
    return out


# Some cases name the kernel the op routes them to: the H200's choice, set by its waves (132 SMs). On a part with
# another SM count those cases still check their results, and the route only where the case computes it from the
# device (the few-rows and twin tests do).
MEASURED_SMS = 132


def _assert_route(got, want, context):
    """``got == want`` on a device with the SM count the routes were measured on (see MEASURED_SMS)."""
    if torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count == MEASURED_SMS:
        assert got == want, (context, got, want)


def _record_fallback(monkeypatch):
    """The rows of each call of decode_topk's exact torch fallback from now on (a list to assert empty): a test that
    calls decode_topk directly and then compares with the reference passes on the fallback too, where a routing
    change or a refused cache sends its call there (a RuntimeWarning only)."""
    from runtime import topk

    calls = []
    reference = topk.decode_topk_reference
    monkeypatch.setattr(topk, "decode_topk_reference", lambda lg, *a, **kw: calls.append(lg.shape[0]) or
                        reference(lg, *a, **kw))
    return calls


def _launch_direct(kernel, logits, row_ends, k, ctas_per_row):
    """One kernel of the cache launched directly (no host op, no routing) on every row; its output, synchronised."""
    from benchmarks.bench_topk import launch_direct

    out = torch.full((logits.shape[0], k), -7, dtype=torch.int32, device=logits.device)
    launch_direct(kernel, ctas_per_row, logits, row_ends, out, k)
    torch.cuda.synchronize()
    return out


def _direct_mismatch(kernel, logits, row_ends, k, ctas_per_row, block_mode):
    """``_launch_direct`` checked against the reference: None when it matches, else the check's message (so a
    test can collect every failing case before it asserts)."""
    out = _launch_direct(kernel, logits, row_ends, k, ctas_per_row)
    try:
        _check(logits, row_ends, out, k, block_mode)
    except AssertionError as e:
        return str(e)
    return None


def _check(logits, row_ends, out, k, block_mode):
    from runtime.reference import DECODE_TOPK_BLOCK, decode_topk_keys, decode_topk_reference

    ref = decode_topk_reference(logits, row_ends, k, block_mode=block_mode)
    got_sorted = torch.sort(out, dim=1).values
    ref_sorted = torch.sort(ref, dim=1).values
    # No duplicates among the selected (non -1) indices.
    dup = (got_sorted[:, 1:] == got_sorted[:, :-1]) & (got_sorted[:, 1:] >= 0)
    assert not dup.any(), f"duplicate indices in rows {dup.any(dim=1).nonzero().flatten().tolist()[:8]}"
    # In range: -1 or a candidate of its row.
    width = logits.shape[1]
    ends = row_ends.long().clamp(0, width)
    if block_mode:
        ends = (ends + DECODE_TOPK_BLOCK - 1) // DECODE_TOPK_BLOCK
    assert ((out >= -1) & (out.long() < ends[:, None])).all(), "index out of range"
    # A short row holds its candidates first, then -1 (the README's contract: a consumer may count a row's active
    # columns as a prefix); the set comparisons below would not see -1 among the candidates.
    chosen = out >= 0
    gap = ~chosen[:, :-1] & chosen[:, 1:]
    assert not gap.any(), f"-1 before a candidate in rows {gap.any(dim=1).nonzero().flatten().tolist()[:8]}"
    # Every selected key >= the k-th best key (the reference's worst), per row.
    keys = decode_topk_keys(logits)
    if block_mode:
        blocks = -(-width // DECODE_TOPK_BLOCK)
        cols = torch.arange(width, device=logits.device)
        valid_cols = cols[None, :] < row_ends.long().clamp(0, width)[:, None]
        keys = torch.where(valid_cols, keys, torch.full_like(keys, -1))
        padded = torch.full((keys.shape[0], blocks * DECODE_TOPK_BLOCK), -1, dtype=torch.long, device=keys.device)
        padded[:, :width] = keys
        keys = padded.view(keys.shape[0], blocks, DECODE_TOPK_BLOCK).amax(dim=2)
    sel = out.long().clamp(min=0)
    got_keys = torch.where(out >= 0, torch.gather(keys, 1, sel), torch.full_like(sel, 1 << 40))
    ref_keys = torch.where(ref >= 0, torch.gather(keys, 1, ref.long().clamp(min=0)), torch.full_like(sel, 1 << 40))
    assert (got_keys.min(dim=1).values >= ref_keys.min(dim=1).values).all(), "a selected key below the k-th"
    # The exact set (ties resolved to the lower index, -1 padding).
    bad = (got_sorted != ref_sorted).any(dim=1)
    assert not bad.any(), f"rows differing from the reference: {bad.nonzero().flatten().tolist()[:8]}"


def _logits(rows, width, dtype, *, stride=None, seed=0):
    """Random logits [rows, width] in rows padded to 32 bytes (the kernel needs 16-byte aligned rows)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    stride = stride or -(-width // 8) * 8
    base = torch.randn(rows, stride, device="cuda", generator=g, dtype=torch.float32).to(dtype)
    return base[:, :width]


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
@pytest.mark.parametrize("k", KS)
def test_grid(dtype, block_mode, k):
    """Random logits over rows x lengths; row ends vary around the length."""
    for rows in ROWS:
        for length in _lengths(k):
            logits = _logits(rows, length, dtype, seed=rows * 7 + length)
            ends = torch.full((rows,), length, dtype=torch.int32, device="cuda")
            if rows > 1:
                # A spread of row ends: full, short of k, a partial last group, zero.
                ends[1] = max(0, length - 3)
                ends[-1] = min(length, k // 2)
            if rows > 2:
                ends[2] = 0
            out = _run(logits, ends, k, block_mode)
            _check(logits, ends, out, k, block_mode)
            del logits, out


ADVERSARIAL = ("all_equal", "two_values", "neg_inf_run", "nan", "ties_at_threshold", "sorted_up", "zeros_signed",
               "zeros_denormals", "nan_signs_inf")


def _adversarial(kind, rows, width, dtype, seed=0, stride=None):
    """Logits of ``kind`` (one of ADVERSARIAL, "narrow_positive", or any other name for randn) in rows of ``stride``
    elements (default: the width rounded up to 8), NaN padding."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, width, device="cuda", generator=g)
    stride = stride or -(-width // 8) * 8
    if kind == "narrow_positive":
        # Indexer-like: positive within an octave, the crowding DeepGEMM's logits with positive head weights show
        # (benchmarks/results/HISTORY.md); a draw of its own from the seed.
        own = torch.Generator(device="cuda").manual_seed(seed)
        x = 1.0 + 0.9 * torch.rand(rows, width, device="cuda", generator=own)
    elif kind == "all_equal":
        x = torch.full_like(x, 0.5)
    elif kind == "two_values":
        x = torch.where(torch.rand(rows, width, device="cuda", generator=g) < 0.5, 1.0, 2.0)
    elif kind == "neg_inf_run":
        x[:, width // 8: width - width // 8] = float("-inf")
    elif kind == "nan":
        x[torch.rand(rows, width, device="cuda", generator=g) < 0.3] = float("nan")
        x[:, -width // 4:] = float("nan")
    elif kind == "ties_at_threshold":
        x = torch.randint(0, 50, (rows, width), device="cuda", generator=g).float()
    elif kind == "sorted_up":
        x = torch.arange(width, device="cuda", dtype=torch.float32).expand(rows, width).contiguous()
    elif kind == "zeros_signed":
        x = torch.where(torch.rand(rows, width, device="cuda", generator=g) < 0.5, 0.0, -0.0)
        x[:, ::97] = -1.0
    elif kind == "zeros_denormals":
        # The threshold at zero among +-0 (equal), denormals of either sign and NaN (-inf), ~100 positive
        # denormals above it: step 1's raw-bit bins put -0 with +0 and NaN with -inf, not with their raw neighbours.
        u = torch.rand(rows, width, device="cuda", generator=g)
        x = torch.where(u < 0.35, 0.0, -0.0)
        x = torch.where(u >= 0.7, -1e-40, x)
        x = torch.where(u >= 0.95, float("nan"), x)
        x[:, ::max(1, width // 100)] = 1e-40
    padded = torch.full((rows, stride), float("nan"), device="cuda", dtype=dtype)
    padded[:, :width] = x.to(dtype)
    if kind == "nan_signs_inf":
        # NaNs with the sign bit set and other payloads (a negated NaN; CUDA's canonical 0x7FFFFFFF), set as bits
        # after the conversion (which canonicalises a NaN), and +inf: all -inf but the +inf, in every fast path's
        # NaN test.
        f32 = dtype == torch.float32
        ibits = padded.view(torch.int32 if f32 else torch.int16)
        nans = ([0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0xFF800001] if f32 else [0xFFC0, 0x7FFF, 0xFFFF, 0xFF81])
        half = 1 << (31 if f32 else 15)
        u = torch.rand(rows, width, device="cuda", generator=g)
        for i, b in enumerate(nans):
            ibits[:, :width][(u >= 0.1 * i) & (u < 0.1 * (i + 1))] = b - 2 * half if b >= half else b
        padded[:, :width][u >= 0.995] = float("inf")
    return padded[:, :width]


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
@pytest.mark.parametrize("kind", ADVERSARIAL)
def test_adversarial(kind, dtype, block_mode):
    for k in (512, 2048):
        for rows, width in ((1, 65536), (14, 1 << 20), (8, 262144 + 5), (3, 2049)):
            logits = _adversarial(kind, rows, width, dtype, seed=width)
            ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
            out = _run(logits, ends, k, block_mode)
            _check(logits, ends, out, k, block_mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
def test_padded_stride_and_clipped_row_ends(dtype, block_mode):
    """A padded row stride; row ends past the width or negative are clipped to [0, width]."""
    k = 1024
    rows, width, stride = 8, 100003, 100096
    logits = _logits(rows, width, dtype, stride=stride, seed=5)
    assert logits.stride(0) == stride
    ends = torch.tensor([width, width + 1000, 2 ** 31 - 1, -5, 0, 7, width - 1, 50000], dtype=torch.int32,
                        device="cuda")
    out = _run(logits, ends, k, block_mode)
    _check(logits, ends, out, k, block_mode)


def test_out_row_stride_and_exact_tail(monkeypatch):
    """out may be a column slice of a wider buffer: only its k columns are written (by the kernel)."""
    k, rows, width = 512, 4, 70000
    logits = _logits(rows, width, torch.float32, seed=9)
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    buf = torch.full((rows, 3 * k), -9, dtype=torch.int32, device="cuda")
    from runtime.topk import decode_topk

    fallback = _record_fallback(monkeypatch)
    decode_topk(logits, ends, buf[:, k: 2 * k])
    assert not fallback, "the torch fallback wrote out, not the kernel"
    assert (buf[:, :k] == -9).all() and (buf[:, 2 * k:] == -9).all()
    _check(logits, ends, buf[:, k: 2 * k], k, False)


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
@pytest.mark.parametrize("width", (8192, 65536))
def test_rows_past_one_wave(monkeypatch, dtype, block_mode, width):
    """More rows than one wave of any cached kernel holds go as several one-wave launches of the kernel (the
    torch reference must not run), written into a column slice of a wider out, row ends mixed."""
    from runtime import topk

    k = 512
    wave = topk._one_wave_rows(_logits(1, width, dtype), block_mode)
    assert wave > 0, "the cache should serve this device"
    rows = 2 * wave + 3
    logits = _logits(rows, width, dtype, seed=width + rows)
    g = torch.Generator(device="cuda").manual_seed(rows)
    ends = torch.randint(0, width + 50, (rows,), device="cuda", generator=g, dtype=torch.int32)
    ends[::7] = width
    buf = torch.full((rows, 2 * k), -9, dtype=torch.int32, device="cuda")
    calls = []
    reference = topk.decode_topk_reference
    monkeypatch.setattr(topk, "decode_topk_reference", lambda *a, **kw: calls.append(1) or reference(*a, **kw))
    assert not topk.supports_decode_topk(logits, rows, k, block_mode)  # not one wave
    topk.decode_topk(logits, ends, buf[:, k:], block_mode=block_mode)
    assert not calls, "the torch reference ran"
    assert (buf[:, :k] == -9).all()
    _check(logits, ends, buf[:, k:], k, block_mode)


@pytest.mark.parametrize("width", (8192, 65536))
def test_one_row_with_a_row_stride_off_16_bytes(monkeypatch, width):
    """One row of logits whose buffer's row stride is not a 16-byte multiple (4 bytes past one): the kernel reads
    the row from its start alone, so it takes the call (it went to the fallback until the forty-third session)."""
    k = 2048
    buf = _logits(8, width, torch.float32, stride=width + 1, seed=width)  # rows (width + 1) floats apart
    assert (buf.stride(0) * 4) % 16 == 4
    ends = torch.full((1,), width - 3, dtype=torch.int32, device="cuda")
    fallback = _record_fallback(monkeypatch)
    for row in (0, 4):  # the rows whose start is 16-byte aligned
        one = buf[row:row + 1]
        out = _run(one, ends, k, False)
        assert not fallback, "the torch fallback wrote out, not the kernel"
        _check(one, ends, out, k, False)


def test_fallback_matches_for_unaligned_logits():
    """An unaligned view is not the kernel's: the exact fallback selects, row by row, the set the kernel selects
    from an aligned copy of the same values (a full row, a short one, one of fewer candidates than k)."""
    from runtime.topk import supports_decode_topk

    k, rows, width = 512, 3, 9000
    base = _logits(rows, width + 1, torch.float32, seed=3)
    logits = base[:, 1:]
    assert not supports_decode_topk(logits, rows, k, False)
    ends = torch.tensor([width, 5000, 300], dtype=torch.int32, device="cuda")
    out = _run(logits, ends, k, False, expect_kernel=False)
    by_kernel = _run(logits.contiguous(), ends, k, False)
    assert torch.equal(torch.sort(out, dim=1).values, torch.sort(by_kernel, dim=1).values)
    _check(logits, ends, out, k, False)


def test_every_variant():
    """Every variant of the contract (each cluster size), launched directly, vs the reference.

    Two widths: a short one (CTA-tile step 1 from 2 CTAs on in token mode, 4 in block mode: one
    or more tiles, re-read where step 1's table marks them) and one past the variant's warp_step1_min_groups
    groups per CTA (the warp step 1: many iterations per warp, bound refreshes; past the table's tiles where the
    variant has one) or, where that would pass the host op's width limit (16 CTAs in token mode), that limit
    (CTA tiles: the largest table).
    """
    import runtime
    from runtime.contract import decode_topk as contract
    from runtime.topk import MAX_WIDTH

    cache = runtime.load()
    bad = []
    for v in contract.CLUSTER_VARIANTS:  # the row variants: test_row_kernel
        kernel = cache.kernel(v.name)
        tdtype = torch.float32 if v.option("dtype") == "f32" else torch.bfloat16
        block_mode = v.option("block_mode")
        cluster = v.option("cluster")
        # Each CTA's slice of the long rows (width // cluster columns) is past its warp-loop threshold: the
        # variants with step 1's table (c2/c4 full-SM, c8, c16 in token mode) take CTA tiles below 16385 groups.
        warp_from = v.option("warp_step1_min_groups")
        long_width = min(cluster * max(100000, warp_from * 8 + 1000) + 3, MAX_WIDTH)
        assert long_width == MAX_WIDTH or (long_width // cluster) // 8 >= warp_from, v.name
        for kind, width in (("randn", 50000 + cluster), ("ties", 50000 + cluster), ("randn", long_width),
                            ("ties", long_width)):
            k, rows = 1024, 3
            logits = _logits(rows, width, tdtype, seed=cluster)
            if kind == "ties":
                logits = _adversarial("ties_at_threshold", rows, width, tdtype, seed=cluster)
            ends = torch.tensor([width, width // 3, 1500], dtype=torch.int32, device="cuda")
            err = _direct_mismatch(kernel, logits, ends, k, cluster, block_mode)
            if err is not None:
                bad.append(f"{v.name} {kind} width={width}: {err}")
    assert not bad, bad


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
def test_row_kernel(dtype, block_mode):
    """The short-row kernel (one CTA a row, the row in registers), launched directly: widths up to its limit
    (partial last groups, exactly k and k + 1 candidates), row ends short of k, zero and clipped, a padded
    row stride, a full wave of rows, random and adversarial rows."""
    import runtime
    from runtime.contract import decode_topk as contract

    kernel = runtime.load().kernel(contract.row_name_for("f32" if dtype == torch.float32 else "bf16", block_mode))
    widest = contract.ROW_MAX_WIDTH
    bad = []
    for k in KS:
        blocks = 8 if block_mode else 1  # columns an item
        edges = (k * blocks - 3, k * blocks + 1, 2049, 4101, 8192, widest - 7, widest)
        for width in sorted({min(w, widest) for w in edges}):
            for kind in ("randn",) + ADVERSARIAL:
                # A full wave: one row a CTA, as many as the device holds at once (132 on the H200 in token mode,
                # two or three CTAs an SM in block mode).
                rows = kernel.max_active_clusters if (kind == "randn" and width == widest) else 5
                if kind == "randn":
                    logits = _logits(rows, width, dtype, stride=-(-width // 16) * 16 + 16, seed=width + k)
                else:
                    logits = _adversarial(kind, rows, width, dtype, seed=width)
                ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
                ends[1] = k * blocks  # exactly k candidates (block mode: k blocks)
                ends[2] = 0
                ends[3] = -4 if kind == "randn" else width + 100  # clipped to [0, width]
                ends[4] = (k + 1) * blocks - 7  # block mode: k + 1 candidates, a partial last block (token: k - 6)
                err = _direct_mismatch(kernel, logits, ends, k, 1, block_mode)
                if err is not None:
                    bad.append(f"k={k} width={width} {kind}: {err}")
    assert not bad, bad[:6]


def test_short_rows_route_to_the_row_kernel():
    """Through the op: short rows take the row kernel while one wave holds them (runtime.topk._Plan.choose)."""
    from runtime import topk
    from runtime.contract import decode_topk as contract

    widest = contract.ROW_MAX_WIDTH
    for rows, width, k in ((1, topk.ROW_ALWAYS_MAX_WIDTH[False], 512), (8, 4100, 512), (64, 8192, 2048),
                           (132, widest, 1024)):
        logits = _logits(rows, width, torch.float32, seed=rows)
        _assert_route(topk.decode_topk_plan(logits, rows, k, False), (contract.row_name_for("f32", False), 1, rows),
                      (rows, width, k))
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        ends[-1] = k - 1
        out = _run(logits, ends, k, False)
        _check(logits, ends, out, k, False)
    logits = _logits(1, widest + 8, torch.float32)
    assert topk.decode_topk_plan(logits, 1, 512, False)[0] != contract.row_name_for("f32", False)  # any device


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
def test_few_rows_take_the_widest_cluster_that_fits(dtype):
    """3 to 7 rows of 64K columns or more go to 16 CTAs a row where one wave of 16 holds them (else 8),
    through the op, with exact results (row ends short of the width and of k included)."""
    from runtime.topk import decode_topk_plan

    for rows, width, k in ((3, 65536, 2048), (5, 262144 + 5, 512), (7, 1 << 20, 1024), (8, 65536, 512)):
        logits = _logits(rows, width, dtype, seed=rows)
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        ends[-1] = k // 2
        ends[0] = width - 9
        name, cluster, _ = decode_topk_plan(logits, rows, k, False)
        most16 = _max_active_clusters(name.replace(f"_c{cluster}", "_c16"))
        assert cluster == (16 if rows <= most16 else 8), (rows, name, most16)
        out = _run(logits, ends, k, False)
        _check(logits, ends, out, k, False)


def test_bf16_ties_cut_by_rank():
    """BF16 on 8 and 16 CTAs a row resolves the key's last bits cluster-wide (finish_low_bits) and cuts the exact
    ties of the resolved key by rank: many ties planted at the k-th key, spread over every CTA or crowded into one
    CTA's slice (still within its stage), so that the cut falls inside one CTA's ties, more than TIE_RANK_MAX of them
    (ranked by index rounds on a CTA other than 0). Exact results each time."""
    from runtime import topk

    for rows, width, k, planted, crowd in ((1, 262144, 2048, 1500, False), (8, 262144, 2048, 1500, False),
                                           (1, 1 << 20, 2048, 3000, False), (1, 262144, 512, 900, True),
                                           (8, 1 << 20, 1024, 800, True)):
        logits = _logits(rows, width, torch.bfloat16, seed=width + planted)
        name, cluster, _ = topk.decode_topk_plan(logits, rows, k, False)
        assert cluster in (8, 16), name
        g = torch.Generator(device="cuda").manual_seed(planted)
        span = width // cluster
        for r in range(rows):
            row = logits[r]
            # The key at rank k - 600 (k // 2 for small k): the cut lands inside the planted ties.
            v = torch.sort(row.float(), descending=True).values[k - 600 if k > 1200 else k // 2]
            if crowd:  # all in the slice of CTA 3
                cols = 3 * span + torch.randperm(span, generator=g, device="cuda")[:planted]
            else:
                cols = torch.randperm(width, generator=g, device="cuda")[:planted]
            row[cols] = v.to(torch.bfloat16)
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        out = _run(logits, ends, k, False)
        _check(logits, ends, out, k, False)


def test_long_slices_take_the_full_sm_twin():
    """Through the op: slices of FULL_SM_TWIN_MIN_COLUMNS or more on 2 and 4 CTAs a row take the one-CTA-an-SM
    twin where one wave of it holds the rows, else the two-CTA build; a 64 MiB FP32 batch (the largest one wave of
    the table's CTA tiles holds) runs them. Exact results each time."""
    from runtime import topk

    twin_min = topk.FULL_SM_TWIN_MIN_COLUMNS
    for rows, width, k, dtype in ((64, 65536, 2048, torch.bfloat16), (20, 4 * twin_min + 40, 512, torch.float32),
                                  (64, 262144, 1024, torch.float32), (20, 4 * twin_min - 8, 512, torch.float32),
                                  (100, 65536, 512, torch.float32)):
        logits = _logits(rows, width, dtype, seed=rows + width)
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        ends[1] = width - 5
        ends[-1] = k - 3
        name, cluster, _ = topk.decode_topk_plan(logits, rows, k, False)
        most = _max_active_clusters(name.removesuffix("_full_sm") + "_full_sm")
        twin = rows <= most and width >= cluster * twin_min
        assert cluster in (2, 4) and name.endswith("_full_sm") == twin, (rows, width, name, most)
        out = _run(logits, ends, k, False)
        _check(logits, ends, out, k, False)


def test_finish_ranks_a_small_bin_by_key_then_index():
    """FP32 rows whose gathered finish resolves the threshold after its first round by ranking a small bin (at most
    TIE_RANK_MAX items) directly: near the k-th value, copies of it and of its two neighbouring floats (the same bin
    after the first round, apart only in the last bits) are planted at random columns, so that the cut falls among
    equal and nearly equal keys (larger key first, then lower index). The twin, 16 CTAs, the short-row kernel and a
    2-CTA build (each case asserts its kernel on the H200's SM count, _assert_route). Exact results each time."""
    from runtime import topk

    for rows, width, k, copies, kernel in ((64, 262144, 2048, 12, "c2_full_sm"), (1, 65536, 2048, 15, "c16"),
                                           (8, 8192, 512, 10, "row"), (100, 32768, 1024, 12, "c2")):
        logits = _logits(rows, width, torch.float32, seed=width + k + copies)
        name = topk.decode_topk_plan(logits, rows, k, False)[0]
        _assert_route(name, f"decode_topk_f32_token_{kernel}", (rows, width))
        g = torch.Generator(device="cuda").manual_seed(k + copies)
        for r in range(rows):
            row = logits[r]
            v = torch.sort(row, descending=True).values[k - 8]
            near = (torch.nextafter(v, v.new_tensor(float("inf"))), v, torch.nextafter(v, v.new_tensor(float("-inf"))))
            cols = torch.randperm(width, generator=g, device="cuda")[: 3 * copies]
            for i, x in enumerate(near):
                row[cols[i * copies:(i + 1) * copies]] = x
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        out = _run(logits, ends, k, False)
        _check(logits, ends, out, k, False)


def _crowded(rows, width, dtype, start, k, seed):
    """3000 equal keys from column start on (one CTA's slice), k / 2 of them taken; k / 2 larger keys elsewhere, the
    rest smaller."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = _logits(rows, width, dtype, seed=seed)
    logits.copy_((torch.rand(rows, width, device="cuda", generator=g) - 0.5).to(dtype))
    logits[:, start:start + 3000] = 5.0
    above = torch.randperm(width - 3000, generator=g, device="cuda")[:k // 2]
    above = torch.where(above < start, above, above + 3000)
    logits[:, above] = (6.0 + torch.rand(rows, k // 2, device="cuda", generator=g)).to(dtype)
    return logits


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
def test_gathered_pushes_on_8_and_16_ctas(dtype):
    """The 8- and 16-CTA kernels (one CTA an SM, token mode), launched directly: the gathered finish's pushes into
    CTA 0's list by st.async, staged (a CTA's items of the threshold bin within GATHER_STAGE) or not (over 1024 equal
    keys crowded into one CTA's slice, cut by index), and the pass over two register-resident tiles at its bounds (a
    CTA slice of T + 1 and of 2 T groups, the last group partial), with a row end short of the width."""
    import runtime
    from runtime.contract import decode_topk as contract

    cache = runtime.load()
    T = contract.THREADS
    bad = []
    for cluster in (8, 16):
        kernel = cache.kernel(contract.name_for("f32" if dtype == torch.float32 else "bf16", False, cluster))
        for groups in (T + 1, 2 * T):
            width = cluster * groups * 8 - 3
            for kind in ("randn", "ties_at_threshold", "crowded"):
                for k in (512, 2048):
                    rows = 2
                    if kind == "randn":
                        logits = _logits(rows, width, dtype, seed=width + k)
                    elif kind == "crowded":
                        logits = _crowded(rows, width, dtype, 2 * groups * 8, k, seed=width + k)
                    else:
                        logits = _adversarial(kind, rows, width, dtype, seed=width + k)
                    ends = torch.tensor([width, width - 5], dtype=torch.int32, device="cuda")
                    err = _direct_mismatch(kernel, logits, ends, k, cluster, False)
                    if err is not None:
                        bad.append(f"c{cluster} groups={groups} {kind} k={k}: {err}")
    assert not bad, bad


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
def test_refined_floor_with_ties_at_its_sub_bins(dtype):
    """Rows whose gathered finish takes the refined floor (CTA-tile slices on 2 and 8 CTAs, many items from the
    threshold bin up): half the rows on a 1/64 grid, so each of the threshold bin's 32 sub-bins holds one value and
    the floor falls on exact ties (lower indices win), half plain randn; one row end clipped inside a group."""
    from runtime import topk

    for rows, width, cluster in ((8, 262144 + 5, 8), (64, 262144, 2)):
        for k in (1024, 2048):
            logits = _logits(rows, width, dtype, seed=width + k)
            _assert_route(topk.decode_topk_plan(logits, rows, k, False)[1], cluster, (rows, width, k))
            logits[: rows // 2] = ((logits[: rows // 2].float() * 64).round() / 64).to(dtype)
            ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
            ends[1] = width - 3
            out = _run(logits, ends, k, False)
            _check(logits, ends, out, k, False)


def test_refine_window_or_table_pass():
    """FP32 rows whose gathered finish takes the refined floor: 64 x 256K on the 2-CTA twin, a launch that counts the
    groups' maxima in a window during step 1 (kernels/decode_topk/common.py: REFINE_WINDOW_MIN_CTAS), and 8 x 1M on 8
    CTAs, one too small for it (the table pass). Plain rows (every window holds the threshold bin), rows whose first
    CTA's first tile is raised by 4 (its window lies above the bin: the table pass serves) and rows whose second CTA's
    first tile is lowered by 4 (its window lies below), with a clipped row end. Exact."""
    from runtime import topk

    for rows, width, kernel in ((64, 262144, "c2_full_sm"), (8, 1 << 20, "c8")):
        for k in (1024, 2048):
            logits = _logits(rows, width, torch.float32, seed=width + k + 7)
            name, cluster, _ = topk.decode_topk_plan(logits, rows, k, False)
            _assert_route(name, f"decode_topk_f32_token_{kernel}", (rows, width, k))
            second = -(-(width // 8) // cluster) * 8  # the second CTA's first column
            logits[1::4, :4096] += 4.0
            logits[2::4, second: second + 4096] -= 4.0
            ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
            ends[3] = width - 3
            out = _run(logits, ends, k, False)
            _check(logits, ends, out, k, False)


@pytest.mark.parametrize("dtype", DTYPES, ids=("f32", "bf16"))
def test_twin_warp_loop_with_one_crowded_warp(dtype):
    """The one-CTA-an-SM twins (2 and 4 CTAs) launched directly on slices past their table's tiles (step 1's warp
    loop), each slice crowding one warp with more items at or above its k-th largest bin than LIST_CAPACITY's share
    (benchmarks/step1_list_emulation.py: crowded_warp_slice): a list of LIST_CAPACITY is given up there (its CTA
    re-reads the slice), the twins' TWIN_LIST_CAPACITY keeps it and fills its headroom; a row end short of the width.
    Exact results each time."""
    import runtime
    from benchmarks.step1_list_emulation import CROWDED_CTA_COLUMNS, crowded_warp_rows
    from runtime.contract import decode_topk as contract

    cache = runtime.load()
    name = "f32" if dtype == torch.float32 else "bf16"
    cta_columns = CROWDED_CTA_COLUMNS
    assert cta_columns // 8 >= contract.warp_step1_min_groups(False, 1)
    bad = []
    for cluster in (2, 4):
        kernel = cache.kernel(contract.name_for(name, False, cluster, full_sm=True))
        for k in (1024, 2048):
            logits = crowded_warp_rows(2, cluster, cta_columns, k, seed=cluster + k).to("cuda", dtype)
            width = logits.shape[1]
            ends = torch.tensor([width, width - 5], dtype=torch.int32, device="cuda")
            err = _direct_mismatch(kernel, logits, ends, k, cluster, False)
            if err is not None:
                bad.append(f"c{cluster} k={k}: {err}")
    assert not bad, bad



@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_op_inside_torch_compile(backend):
    """A compiled function (one graph: fullgraph) holds decode_topk as its custom op, whose call runs the kernel (the
    torch fallback is made to raise): exact results, token and block mode, FP32 and BF16 logits (inductor, whose
    compile takes seconds a graph, on FP32 token mode only)."""
    from unittest import mock

    from runtime import topk

    cases = [(d, b) for d in DTYPES for b in (False, True)] if backend == "aot_eager" else [(torch.float32, False)]
    for dtype, block_mode in cases:
        logits = _logits(8, 65536, dtype, seed=31)
        ends = torch.full((8,), 65536, dtype=torch.int32, device="cuda")
        ends[1] = 5000
        out = torch.full((8, 512), -7, dtype=torch.int32, device="cuda")

        def step(x, e, o, block_mode=block_mode):
            topk.decode_topk(x, e, o, block_mode=block_mode)
            return o.clone()

        torch._dynamo.reset()
        compiled = torch.compile(step, backend=backend, fullgraph=True)
        fallback = AssertionError("the compiled decode_topk ran its torch fallback")
        with mock.patch.object(topk, "decode_topk_reference", side_effect=fallback):
            got = compiled(logits, ends, out)
        _check(logits, ends, out, 512, block_mode)
        assert torch.equal(got, out)


def _max_active_clusters(name):
    import runtime

    return runtime.load().kernel(name).max_active_clusters


def test_cuda_graph_capture(monkeypatch):
    from runtime.topk import decode_topk

    k, rows, width = 2048, 8, 65536
    logits = _logits(rows, width, torch.bfloat16, seed=1)
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    out = torch.zeros((rows, k), dtype=torch.int32, device="cuda")
    fallback = _record_fallback(monkeypatch)
    decode_topk(logits, ends, out)  # loads the cache before capture
    torch.cuda.synchronize()
    out.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_topk(logits, ends, out)
    torch.cuda.synchronize()
    assert (out == 0).all(), "the capture ran the op instead of recording it"
    logits.copy_(_logits(rows, width, torch.bfloat16, seed=2))  # the replay selects from new values
    g.replay()
    torch.cuda.synchronize()
    assert not fallback, "the torch fallback was captured, not the kernel"
    _check(logits, ends, out, k, False)


@pytest.mark.parametrize("pdl", (True, False), ids=("pdl", "in_stream_order"))
def test_back_to_back_launches_keep_stream_order(monkeypatch, pdl):
    """Programmatic dependent launch lets a launch be scheduled while the one before it runs;
    a fast launch right behind a slow one into the same output rows must still land last
    (it waits before any global access), eagerly and inside a CUDA graph; so must a launch
    in plain stream order (pdl=False) behind one with PDL."""
    from runtime.topk import decode_topk

    k, rows = 512, 64
    slow = _logits(rows, 262144, torch.float32, seed=3)
    fast = _logits(rows, 4096, torch.bfloat16, seed=4)
    slow_ends = torch.full((rows,), 262144, dtype=torch.int32, device="cuda")
    fast_ends = torch.randint(k, 4097, (rows,), dtype=torch.int32, device="cuda")
    out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    fallback = _record_fallback(monkeypatch)  # the fallback launches no PDL kernel: it would prove nothing here

    def pair(last, last_ends, first=slow, first_ends=slow_ends):
        for _ in range(4):
            decode_topk(first, first_ends, out)
            decode_topk(last, last_ends, out, pdl=pdl)

    pair(fast, fast_ends)
    torch.cuda.synchronize()
    _check(fast, fast_ends, out, k, False)
    pair(slow, slow_ends, first=fast, first_ends=fast_ends)
    torch.cuda.synchronize()
    _check(slow, slow_ends, out, k, False)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pair(fast, fast_ends)
    out.fill_(-7)
    g.replay()
    torch.cuda.synchronize()
    assert not fallback, f"the torch fallback ran on {fallback} rows, not the kernels"
    _check(fast, fast_ends, out, k, False)


# A count held by a CUDA tensor is refused before anything is read or launched: reading it would wait for the GPU,
# and during a graph capture it would fail with the capture's error instead of one naming the argument.
def test_counts_on_the_gpu_are_refused_also_during_capture():
    from runtime.topk import supports_decode_topk

    logits = torch.randn(4, 8192, device="cuda")
    rows = torch.tensor(4, device="cuda")
    with pytest.raises(TypeError, match=r"^rows: expected an integer, got a tensor on cuda:0; pass a Python int"):
        supports_decode_topk(logits, rows, 512, False)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(TypeError, match=r"^rows: expected an integer, got a tensor on cuda:0"), torch.cuda.graph(graph):
        supports_decode_topk(logits, rows, 512, False)
    assert supports_decode_topk(logits, 4, 512, False)


# A seeded sweep of random calls through the op: rows, widths (log-uniform up to 1M columns, or next to a size where the
# routing or the kernels' tiling changes), k, dtype, mode, the row stride's padding, row ends (negative, past the width,
# around k) and the values (the adversarial kinds, plus indexer-like rows crowded within an octave) all drawn at
# random, so that sizes and routes no listed case names get their share. The count: conftest.py's fuzz_cases.
FUZZ_ROWS = (1, 2, 3, 5, 7, 8, 9, 14, 15, 16, 17, 31, 47, 64, 65, 100, 132, 133, 200, 264, 265, 300)
FUZZ_EDGES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1 << 20)
FUZZ_MAX_ITEMS = 1 << 25  # rows x columns a case (128 MiB of FP32 logits)


def _fuzz_case(rng):
    """(rows, width, k, dtype, block_mode, stride, kind, ends) drawn from ``rng`` (a random.Random)."""
    k = rng.choice((512, 1024, 2048))
    if rng.random() < 0.4:
        width = max(1, rng.choice(FUZZ_EDGES) + rng.choice((-9, -8, -1, 0, 1, 7, 8, 9)))
    else:
        width = int(2 ** rng.uniform(0, 20))
    rows = rng.choice([r for r in FUZZ_ROWS if r * width <= FUZZ_MAX_ITEMS] or [1])
    dtype = rng.choice(DTYPES)
    align = 16 // (4 if dtype == torch.float32 else 2)
    stride = -(-width // align) * align + align * rng.choice((0, 0, 0, 1, 5))
    kind = rng.choice(("randn", "narrow_positive") + ADVERSARIAL)
    block_mode = rng.random() < 0.3
    unit = 8 if block_mode else 1  # the row end at which the row holds k candidates
    ends = [rng.choice((width, width, 0, -3, width + 5, k * unit, k * unit - 1, k * unit + 1, width - 1,
                        rng.randint(0, max(width, 1)))) for _ in range(rows)]
    return rows, width, k, dtype, block_mode, stride, kind, ends


def test_random_calls_match_the_reference(monkeypatch, fuzz_cases):
    import random

    from runtime.topk import decode_topk, supports_decode_topk

    cases = fuzz_cases
    rng = random.Random(47)
    fallback_rows = _record_fallback(monkeypatch)
    bad = []
    taken = 0
    for i in range(cases):
        rows, width, k, dtype, block_mode, stride, kind, ends = case = _fuzz_case(rng)
        logits = _adversarial(kind, rows, width, dtype, seed=i, stride=stride)
        row_ends = torch.tensor(ends, dtype=torch.int32, device="cuda")
        out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
        fallback_rows.clear()
        kernel = supports_decode_topk(logits, rows, k, block_mode)
        taken += kernel
        decode_topk(logits, row_ends, out, block_mode=block_mode)
        try:
            # Every drawn call is aligned: one wave runs on a kernel, more rows a wave at a time, never the fallback
            assert not fallback_rows, ("the torch fallback ran: " + ("supports_decode_topk said the kernel takes it"
                                                                     if kernel else "rows past one wave"))
            _check(logits, row_ends, out, k, block_mode)
        except AssertionError as e:
            bad.append(f"case {i} {case[:7]}: {str(e)[-300:]}")
    assert not bad, (len(bad), bad[:5])
    # The sweep is of the kernels: most draws are calls one wave of a cached kernel takes (the rest, rows past a
    # wave, run a wave at a time). Every drawn row stride is a 16-byte multiple: the fallback for the others has its
    # own test (test_fallback_matches_for_unaligned_logits).
    assert taken >= cases // 2, (taken, cases)
