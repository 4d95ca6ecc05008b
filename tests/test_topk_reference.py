"""decode_topk reference vs brute force on the CPU (CI), and the host op's argument checks."""

import math
import random
import re
import subprocess
import sys
import types

import pytest
import torch
from odd_tensors import Storageless, at_byte_offset

from runtime.reference import decode_topk_keys, decode_topk_reference

SPECIALS = (float("-inf"), float("inf"), float("nan"), 0.0, -0.0, 1.0, -1.0, 2.5, 2.5, 1e-30, -1e30)


def _brute(row, end, k, block_mode):
    """Python ranking: larger value first (NaN as -inf, -0 == +0), lower index first among equals."""
    vals = [(-math.inf if math.isnan(v) else v) for v in row[: max(0, min(end, len(row)))]]
    if block_mode:
        vals = [max(vals[b: b + 8]) for b in range(0, len(vals), 8)]
    order = sorted(range(len(vals)), key=lambda i: (-vals[i], i))[:k]
    return order + [-1] * (k - len(order))


def _rows(seed, rows, width, dtype, pool):
    rnd = random.Random(seed)
    data = [[rnd.choice(pool) for _ in range(width)] for _ in range(rows)]
    t = torch.tensor(data, dtype=torch.float32).to(dtype)
    # Brute force on the values as stored (BF16 rounds; NaN stays NaN).
    return t, t.float().tolist()


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("f32", "bf16"))
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
@pytest.mark.parametrize("seed", range(6))
def test_reference_matches_brute_force(dtype, block_mode, seed):
    rnd = random.Random(seed)
    width = rnd.choice((1, 7, 8, 9, 63, 200))
    rows = 6
    pool = SPECIALS if seed % 2 else tuple(round(rnd.uniform(-3, 3), 1) for _ in range(5)) + SPECIALS[:3]
    logits, values = _rows(seed, rows, width, dtype, pool)
    ends = torch.tensor([width, 0, max(0, width - 3), width + 5, -2, rnd.randint(0, width)], dtype=torch.int32)
    for k in (1, 5, 16, 64):
        got = decode_topk_reference(logits, ends, k, block_mode=block_mode)
        assert got.dtype == torch.int32 and got.shape == (rows, k)
        for r in range(rows):
            assert got[r].tolist() == _brute(values[r], int(ends[r]), k, block_mode), (r, k)


def test_ties_go_to_lower_index():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0, 2.0]])
    got = decode_topk_reference(x, torch.tensor([8], dtype=torch.int32), 4)
    assert got.tolist() == [[1, 3, 2, 4]]
    got = decode_topk_reference(x, torch.tensor([8], dtype=torch.int32), 4, block_mode=True)
    assert got.tolist() == [[0, -1, -1, -1]]


def test_all_equal_and_short_rows():
    x = torch.full((2, 40), 7.0)
    got = decode_topk_reference(x, torch.tensor([40, 3], dtype=torch.int32), 5)
    assert got.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, -1, -1]]
    # Blocks clipped to the row end: 17 columns -> 3 blocks.
    got = decode_topk_reference(x, torch.tensor([17, 0], dtype=torch.int32), 5, block_mode=True)
    assert got.tolist() == [[0, 1, 2, -1, -1], [-1] * 5]


def test_nan_counts_as_neg_inf_and_signed_zero_ties():
    x = torch.tensor([[float("nan"), float("-inf"), -0.0, 0.0, float("nan")]])
    got = decode_topk_reference(x, torch.tensor([5], dtype=torch.int32), 5)
    # 0 and -0 tie (lower index first); NaN and -inf tie.
    assert got.tolist() == [[2, 3, 0, 1, 4]]


def test_keys_preserve_order():
    vals = torch.tensor([float("-inf"), -3e38, -1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, 3e38, float("inf")])
    for dtype in (torch.float32, torch.bfloat16):
        keys = decode_topk_keys(vals.to(dtype))
        assert (keys[1:] >= keys[:-1]).all()
        assert keys[4] == keys[5]
        assert decode_topk_keys(torch.tensor([float("nan")]).to(dtype))[0] == keys[0]
        # Strictly increasing but for the +-0 pair: ">=" alone holds for a constant key (every negative value
        # mapped to one key), which would make the GPU tests' "no selected key below the k-th" check vacuous.
        assert (keys[1:] > keys[:-1]).tolist() == [True] * 4 + [False] + [True] * 4


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("f32", "bf16"))
def test_keys_order_as_the_values_do(dtype):
    """Every pair of values, specials, denormals and random values of both signs among them: keys compare as the
    values do (NaN as -inf, -0 as +0), within [0, 2^32) for FP32 and [0, 2^16) for BF16."""
    g = torch.Generator().manual_seed(11)
    vals = torch.cat([torch.tensor(SPECIALS + (1e-40, -1e-40, 3e38, -3e38)), torch.randn(200, generator=g),
                      torch.randn(50, generator=g) * 1e-39, torch.randint(-3, 4, (50,), generator=g).float()])
    vals = vals.to(dtype)
    keys = decode_topk_keys(vals)
    v = vals.double()
    v = torch.where(torch.isnan(v), torch.full_like(v, float("-inf")), v)
    assert (keys[:, None] < keys[None, :]).equal(v[:, None] < v[None, :])
    assert (keys[:, None] == keys[None, :]).equal(v[:, None] == v[None, :])
    assert keys.min() >= 0 and keys.max() < (1 << (32 if dtype == torch.float32 else 16))


def test_host_op_cpu_fallback_and_checks():
    from runtime.topk import decode_topk, supports_decode_topk

    logits = torch.randn(3, 1000)
    ends = torch.tensor([1000, 600, 0], dtype=torch.int32)
    out = torch.empty(3, 512, dtype=torch.int32)
    assert not supports_decode_topk(logits, 3, 512, False)
    decode_topk(logits, ends, out)
    ref = decode_topk_reference(logits, ends, 512)
    assert torch.equal(torch.sort(out, 1).values, torch.sort(ref, 1).values)

    with pytest.raises(TypeError, match=r"^logits must be float32 or bfloat16"):
        decode_topk(logits.double(), ends, out)
    with pytest.raises(ValueError, match=r"^logits must be 2-D"):
        decode_topk(logits[0], ends, out)
    with pytest.raises(TypeError, match=r"^row_ends must be int32"):
        decode_topk(logits, ends.long(), out)
    with pytest.raises(ValueError, match=r"^row_ends must have shape \[3\]"):
        decode_topk(logits, ends[:2], out)
    with pytest.raises(TypeError, match=r"^out must be int32"):
        decode_topk(logits, ends, out.long())
    with pytest.raises(ValueError, match="k = out.shape"):
        decode_topk(logits, ends, torch.empty(3, 100, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^out must have shape \[3, k\]"):
        decode_topk(logits, ends, torch.empty(2, 512, dtype=torch.int32))
    with pytest.raises(ValueError, match="out must have unit column stride"):
        decode_topk(logits, ends, torch.empty(512, 3, dtype=torch.int32).t())
    with pytest.raises(ValueError, match="out must have unit column stride"):  # one row: no overlap check to hit
        decode_topk(logits[:1], ends[:1], torch.empty(1, 1024, dtype=torch.int32)[:, ::2])
    with pytest.raises(ValueError, match="logits must have unit column stride"):
        decode_topk(torch.randn(1000, 3).t(), ends, out)
    with pytest.raises(ValueError, match="row_ends must be contiguous"):
        decode_topk(logits, torch.zeros(6, dtype=torch.int32)[::2], out)
    with pytest.raises(ValueError, match="logits, row_ends and out must be on one device"):
        decode_topk(logits, ends, torch.empty(3, 512, dtype=torch.int32, device="meta"))
    with pytest.raises(TypeError, match="block_mode"):
        decode_topk(logits, ends, out, block_mode=1)
    for offset in (1, 2, 3):  # an int32 tensor over a storage sliced at a byte offset: the kernel's words would fault
        with pytest.raises(ValueError, match=r"^row_ends must start at a 4-byte aligned address"):
            decode_topk(logits, at_byte_offset(ends, offset), out)
        with pytest.raises(ValueError, match=r"^out must start at a 4-byte aligned address"):
            decode_topk(logits, ends, at_byte_offset(out, offset))
    for name in ("logits", "row_ends", "out"):  # a DTensor-like wrapper: data_ptr 0, which the kernel would read
        args = {"logits": logits, "row_ends": ends, "out": out}
        args[name] = Storageless(args[name])
        with pytest.raises(TypeError, match=rf"^{name} is a Storageless without memory of its own"):
            decode_topk(*args.values())
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"block_mode must be a Python bool, got numpy\.bool_? .*True_?; pass bool"):
        decode_topk(logits, ends, out, block_mode=np.bool_(True))  # numpy names its type "bool" too
    # its fix said "pass bool(pdl)", which for this string is True
    with pytest.raises(TypeError, match=r"^pdl must be a Python bool, got builtins\.str 'False'; pass True or False "
                                        r"\(bool\('False'\) is True\)$"):
        decode_topk(logits, ends, out, pdl="False")  # true: it would launch with PDL


def test_a_tensor_flag_is_refused_without_reading_it():
    """block_mode or pdl given as a tensor (a device mask's any()) was refused with its repr in the message: a device
    tensor's repr copies its value back, which waits for the GPU and fails inside a CUDA-graph capture with the
    capture's error instead of this one. Named by its type, shape and device instead."""
    from runtime.topk import decode_topk

    logits = torch.randn(2, 64)
    ends = torch.tensor([64, 10], dtype=torch.int32)
    out = torch.empty(2, 512, dtype=torch.int32)

    class Unreadable(torch.Tensor):  # a device tensor's value cannot be read here
        def __repr__(self):
            raise AssertionError("the refusal read the tensor's value")

        __str__ = __repr__

    flag = torch.tensor(True).as_subclass(Unreadable)
    for name in ("block_mode", "pdl"):
        with pytest.raises(TypeError, match=rf"^{name} must be a Python bool, got a Unreadable of shape \(\) on cpu; "
                                            r"pass a Python bool"):
            decode_topk(logits, ends, out, **{name: flag})


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 1), (torch.float32, 2), (torch.bfloat16, 1)])
def test_logits_off_their_element_size_are_refused(dtype, offset):
    """Logits over a storage sliced at a byte offset were taken to the exact fallback, whose torch ops read them by
    their elements: on the device a misaligned address, which leaves the CUDA context unusable (why row_ends and out
    off 4 bytes are refused). Refused before anything runs, naming the logits; logits off 16 bytes but on their element
    size still take the fallback."""
    from runtime.topk import decode_topk

    logits = at_byte_offset(torch.randn(3, 600).to(dtype), offset)
    ends = torch.full((3,), 600, dtype=torch.int32)
    out = torch.empty(3, 512, dtype=torch.int32)
    size = logits.element_size()
    with pytest.raises(ValueError, match=rf"^logits must start at a {size}-byte aligned address"):
        decode_topk(logits, ends, out)
    shifted = torch.randn(3, 601).to(dtype)[:, 1:]  # one element in: off 16 bytes, on the element size
    decode_topk(shifted, ends, out)
    ref = decode_topk_reference(shifted, ends, 512)
    assert torch.equal(torch.sort(out, 1).values, torch.sort(ref, 1).values)


def test_fallback_writes_an_out_made_under_inference_mode():
    """An out allocated under torch.inference_mode() (a serving engine's start-up) and passed outside it: the kernel
    writes it through its pointer, while the exact fallback's copy_ raised torch's RuntimeError naming no argument."""
    from runtime.topk import decode_topk

    logits = torch.randn(2, 900)
    ends = torch.tensor([900, 300], dtype=torch.int32)
    with torch.inference_mode():
        out = torch.full((2, 512), -7, dtype=torch.int32)
    decode_topk(logits, ends, out)
    ref = decode_topk_reference(logits, ends, 512)
    assert torch.equal(torch.sort(out, 1).values, torch.sort(ref, 1).values)


@pytest.mark.parametrize("case, fix", [
    ("logits dtype", r"; pass logits\.float\(\)"),
    ("logits strides", r"; pass logits\.contiguous\(\)"),
    ("row_ends dtype", r"; pass row_ends\.int\(\)"),
    ("row_ends strides", r"; pass row_ends\.contiguous\(\)"),
    ("out dtype", r"; allocate it with dtype=torch\.int32"),
    ("devices", r"; pass row_ends on the logits' device and an out allocated there \(the op writes out in place"),
])
def test_refusals_say_the_fix(case, fix):
    """The refusals named the argument and what was wrong ("row_ends must be contiguous") but not what to pass."""
    from runtime.topk import decode_topk

    logits = torch.randn(3, 1000)
    ends = torch.tensor([1000, 600, 0], dtype=torch.int32)
    out = torch.empty(3, 512, dtype=torch.int32)
    args = {
        "logits dtype": (logits.double(), ends, out),
        "logits strides": (torch.randn(1000, 3).t(), ends, out),
        "row_ends dtype": (logits, ends.long(), out),
        "row_ends strides": (logits, torch.zeros(6, dtype=torch.int32)[::2], out),
        "out dtype": (logits, ends, out.long()),
        "devices": (logits, ends, torch.empty(3, 512, dtype=torch.int32, device="meta")),
    }[case]
    with pytest.raises((TypeError, ValueError), match=fix):
        decode_topk(*args)


def test_runtime_topk_imports_no_cutlass():
    code = ("import sys, runtime.topk; "
            "sys.exit(int(any(m.split('.')[0] in ('cutlass', 'kernels') for m in sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_cubins_for_both_archs_match_the_contract():
    """Structural check of the committed cache (sm_100a cannot run here): every variant, its launch shape and,
    where cuobjdump is installed, cluster barriers, distributed-shared-memory reads and the bulk L2 prefetch in
    the SASS."""
    import json
    from pathlib import Path

    from sass import cuobjdump, sass

    from runtime.contract import decode_topk as contract

    repo = Path(__file__).resolve().parent.parent
    has_tool = cuobjdump() is not None
    for arch in ("sm_90a", "sm_100a"):
        kernels = {k["name"]: k for k in json.loads((repo / "manifests" / f"{arch}.json").read_text())["kernels"]}
        for v in contract.VARIANTS:
            entry = kernels[v.name]
            assert entry["threads"] == v.threads and tuple(entry["cluster"]) == v.cluster
            assert entry["smem_bytes"] == v.smem_bytes and entry["non_portable_cluster"] == (v.cluster_size > 8)
            assert [(p["name"], p["ctype"]) for p in entry["params"]] == [(p.name, p.ctype) for p in v.params]
            if not has_tool or not (v.cluster_size in (2, 16) or v.option("ctas_per_sm") == 1):
                continue  # (the row variants are one CTA an SM too)
            code = sass(str(repo / entry["cubin"]))
            if v.cluster_size in (2, 16):
                assert "UCGABAR_ARV" in code and "UCGABAR_WAIT" in code, (arch, v.name)
                assert "LD.E.128" in code, (arch, v.name)  # the cluster's histogram reads (ld.shared::cluster.v4)
                assert "UBLKPF.L2" in code, (arch, v.name)  # step 1's bulk L2 prefetch of a CTA-tile slice
            if v.option("kind") == "cluster" and v.option("ctas_per_sm") == 1:
                assert "LDL" not in code and "STL" not in code, (arch, v.name)  # 128 registers: nothing spills
            if v.option("kind") == "row":
                assert "UCGABAR" not in code, (arch, v.name)  # one CTA a row: no cluster barrier
                assert "ATOMS" in code and "BAR.SYNC" in code, (arch, v.name)  # CTA histograms and barriers
                assert re.search(r"LDG\.E[.A-Z]*\.128", code), (arch, v.name)  # the row's 16-byte loads
                assert "LDL" not in code and "STL" not in code, (arch, v.name)  # the row stays in registers


def test_full_sm_twins_in_the_contract():
    """The 2- and 4-CTA token kernels have one-CTA-an-SM twins with step 1's table (and its L2 limit) and a longer list;
    block mode and the other cluster sizes have none, and a twin differs from its two-CTA build in nothing else the
    launch sees."""
    from runtime.contract import decode_topk as contract

    names = {v.name: v for v in contract.VARIANTS}
    for dtype in contract.DTYPES:
        for block_mode in (False, True):
            for c in contract.CLUSTERS:
                twin = names.get(contract.name_for(dtype, block_mode, c, full_sm=True))
                assert (twin is not None) == (c in contract.FULL_SM_TWIN_CLUSTERS and not block_mode), (dtype, c)
                if twin is None:
                    continue
                base = names[contract.name_for(dtype, block_mode, c)]
                assert base.option("ctas_per_sm") == 2 and twin.option("ctas_per_sm") == 1
                assert twin.option("step1_table_tiles") == contract.STEP1_TABLE_TILES
                # A twin's longer list is headroom only: its warps refresh their bound where the base's do.
                assert base.option("list_capacity") == contract.LIST_CAPACITY
                assert twin.option("list_capacity") == contract.TWIN_LIST_CAPACITY > contract.LIST_CAPACITY
                assert base.option("list_refresh_capacity") == twin.option("list_refresh_capacity") == \
                    contract.LIST_CAPACITY
                assert base.smem_bytes == contract.SMEM_BYTES == contract.smem_bytes_for(contract.LIST_CAPACITY)
                assert twin.smem_bytes == contract.smem_bytes_for(contract.TWIN_LIST_CAPACITY) + \
                    contract.STEP1_TABLE_BYTES
                assert (twin.params, twin.threads, twin.cluster) == (base.params, base.threads, base.cluster)


@pytest.mark.parametrize("timeline", [False, True])
def test_kernel_shared_memory_fits_the_contract(monkeypatch, timeline):
    """Every variant's shared-memory arrays (16-byte aligned, in allocation order) fit the smem_bytes the
    runtime launches it with, with and without the timing experiment's marks: an array past the end would
    only show on the GPU, as an illegal address."""
    pytest.importorskip("cutlass")
    from kernels import decode_topk as kernel
    from runtime.contract import decode_topk as contract

    monkeypatch.setenv("DECODE_TOPK_EXPERIMENT", "timeline" if timeline else "")
    for v in contract.VARIANTS:
        op = kernel.make(v)
        used = 0
        for _name, words in op.smem_arrays():
            used = (used + 15) // 16 * 16 + 4 * words
        assert used <= v.smem_bytes, (v.name, used, v.smem_bytes)
        if not timeline:
            assert used == v.smem_bytes, (v.name, used, v.smem_bytes)  # the contract holds nothing else


class _FakeKernel:
    def __init__(self, name, most):
        self.name, self.max_active_clusters = name, most


class _CudaLooking(torch.Tensor):
    """CPU memory that the host op's routing takes for a CUDA tensor (with _plan_for and launch_on stood in)."""

    @property
    def is_cuda(self):
        return True


class _FakeCache:
    """Stands in for a loaded cache on the H200: every decode_topk kernel name (the short-row ones only with
    rows), each with its one-wave row limit (the short-row kernel's: ``row_most``)."""

    most = {1: 264, 2: 132, 4: 60, 8: 15, 16: 7}  # the H200's one-wave clusters (8 and 16: one CTA an SM)

    def __init__(self, rows: bool, row_most: int = 132):
        self.rows, self.row_most = rows, row_most

    def __contains__(self, name):
        return self.rows or not name.endswith("_row")

    def kernel(self, name):
        if name.endswith("_row"):
            return _FakeKernel(name, self.row_most)
        twin = name.endswith("_full_sm")  # one CTA an SM: half the clusters in a wave
        most = self.most[int(name.removesuffix("_full_sm").rsplit("_c", 1)[1])]
        return _FakeKernel(name, most // 2 if twin else most)


def test_cluster_choice_fits_one_wave():
    """The op picks the largest cluster that fits one wave and leaves each CTA >= MIN_COLUMNS_PER_CTA[c] columns."""
    from runtime import topk

    plan = topk._Plan(_FakeCache(rows=False), "f32", False)
    assert plan.row is None
    assert plan.cluster_for(1, 65536) == 16  # a single row takes 16 CTAs from 64K columns
    assert plan.cluster_for(2, 65536) == 16
    assert plan.cluster_for(7, 65536) == 16  # as many rows as one wave of 16 holds
    assert plan.cluster_for(8, 65536) == 8  # two waves of 16 lose to one of 8
    assert plan.cluster_for(7, 65535) == 8  # under 4K columns a CTA on 16
    assert plan.cluster_for(1, 1 << 20) == 16
    assert plan.cluster_for(1, 16384) == 4
    assert plan.cluster_for(1, 8192) == 4  # 2K columns a CTA are enough for 4 CTAs ...
    assert plan.cluster_for(8, 8192) == 4
    assert plan.cluster_for(64, 8192) == 2  # ... where 4 fit one wave
    assert plan.cluster_for(1, 4096) == 1  # but not for 2
    assert plan.cluster_for(1, 8191) == 1
    assert plan.cluster_for(14, 1 << 20) == 8
    assert plan.cluster_for(15, 1 << 20) == 8
    assert plan.cluster_for(16, 1 << 20) == 4
    assert plan.cluster_for(8, 262144) == 8
    assert plan.cluster_for(64, 262144) == 2
    assert plan.cluster_for(64, 2048) == 1
    assert plan.cluster_for(264, 1 << 20) == 1
    assert plan.cluster_for(265, 1 << 20) is None

    class WithoutOneCta(_FakeCache):  # a partial cache (build_kernels.py --only)
        def __contains__(self, name):
            return super().__contains__(name) and not name.endswith("_c1")

    plan = topk._Plan(WithoutOneCta(rows=False), "f32", False)
    assert 1 not in plan.kernels
    assert plan.cluster_for(1, 4096) == 2  # too few columns a CTA for every cluster: the smallest that fits a wave
    assert plan.cluster_for(1, 8192) == 4


def test_short_rows_take_the_row_kernel():
    """The one-CTA-a-row kernel takes rows up to ROW_ALWAYS_MAX_WIDTH[block_mode] columns where one wave of it holds
    them, and token rows up to ROW_MAX_WIDTH where the cluster choice is under 4 CTAs a row; else a cluster kernel."""
    from runtime import topk
    from runtime.contract import decode_topk as contract

    widest = contract.ROW_MAX_WIDTH
    assert topk.ROW_ALWAYS_MAX_WIDTH[False] < widest and topk.ROW_ALWAYS_MAX_WIDTH[True] == widest
    for block_mode in (False, True):
        plan = topk._Plan(_FakeCache(rows=True), "bf16", block_mode)
        row = contract.row_name_for("bf16", block_mode)
        always = topk.ROW_ALWAYS_MAX_WIDTH[block_mode]
        for rows, width in ((1, 1), (1, always), (8, 2048), (60, always), (61, widest), (132, widest)):
            kernel, per_row = plan.choose(rows, width)
            assert (kernel.name, per_row) == (row, 1), (block_mode, rows, width)
        for rows, width in ((133, 4096), (1, widest + 1)):  # more rows than a wave; wider than the kernel
            kernel, per_row = plan.choose(rows, width)
            assert per_row == plan.cluster_for(rows, width) and kernel.name.endswith(f"_c{per_row}")
        assert plan.choose(0, 100) is None
    plan = topk._Plan(_FakeCache(rows=True), "f32", False)
    kernel, per_row = plan.choose(60, widest)  # token rows over 8K that 4 CTAs a row take in one wave
    assert per_row == 4 and kernel.name == "decode_topk_f32_token_c4"
    # Long slices go to the one-CTA-an-SM twin where a wave of it holds the rows; short ones, and more rows, not.
    twin_min = topk.FULL_SM_TWIN_MIN_COLUMNS
    for rows, width, name in ((64, 65536, "decode_topk_f32_token_c2_full_sm"),
                              (66, 4 * twin_min, "decode_topk_f32_token_c2_full_sm"),
                              (30, 4 * twin_min - 8, "decode_topk_f32_token_c4"),
                              (67, 65536, "decode_topk_f32_token_c2"),
                              (30, 4 * twin_min, "decode_topk_f32_token_c4_full_sm"),
                              (8, widest, "decode_topk_f32_token_c4"),
                              (31, 1 << 20, "decode_topk_f32_token_c4")):
        kernel, per_row = plan.choose(rows, width)
        assert kernel.name == name, (rows, width, kernel.name)
    assert not topk._Plan(_FakeCache(rows=True), "f32", True).twins  # block mode has none


def test_which_calls_the_kernel_takes(monkeypatch):
    """supports_decode_topk on CUDA-looking tensors (a subclass, CPU memory) with a stand-in plan: the kernel
    takes aligned FP32/BF16 rows with unit column stride and a supported k; anything else goes to the fallback."""
    from runtime import topk

    class Plan:
        kernels = {2: (types.SimpleNamespace(name="decode_topk_f32_token_c2"), 132)}

        def choose(self, rows, width):
            return (self.kernels[2][0], 2) if rows <= 132 else None

    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: Plan())
    base = torch.zeros(4, 1032)
    ok = base[:, :1024].as_subclass(_CudaLooking)  # row stride 1032 floats: 16-byte multiple
    assert topk.supports_decode_topk(ok, 4, 512, False)
    assert topk.decode_topk_plan(ok, 4, 512, False) == ("decode_topk_f32_token_c2", 2, 8)
    assert topk.supports_decode_topk(ok.bfloat16().as_subclass(_CudaLooking), 4, 2048, True)
    assert not topk.supports_decode_topk(ok, 4, 256, False)  # k not supported
    assert not topk.supports_decode_topk(ok, 0, 512, False)  # no rows
    assert not topk.supports_decode_topk(ok, 200, 512, False)  # more rows than one wave
    assert not topk.supports_decode_topk(ok.half().as_subclass(_CudaLooking), 4, 512, False)  # dtype
    assert not topk.supports_decode_topk(base[:, 1:1025].as_subclass(_CudaLooking), 4, 512, False)  # 4-byte start
    strided_rows = torch.zeros(4, 1030)[:, :1024].as_subclass(_CudaLooking)
    assert not topk.supports_decode_topk(strided_rows, 4, 512, False)  # row stride
    # One row is read from its start alone: a row stride off 16 bytes does not matter there (its start does).
    assert topk.supports_decode_topk(strided_rows[:1], 1, 512, False)
    assert topk.supports_decode_topk(strided_rows[2:3], 1, 512, False)  # 2 x 4120 bytes in: aligned
    assert not topk.supports_decode_topk(strided_rows[1:2], 1, 512, False)  # 4120 bytes in: its start is not
    assert not topk.supports_decode_topk(base[:, ::2].as_subclass(_CudaLooking), 4, 512, False)  # column stride 2
    assert topk.supports_decode_topk(base[:, ::2][:, :1].as_subclass(_CudaLooking), 4, 512, False)  # one column: any
    assert not topk.supports_decode_topk(torch.zeros(1024).as_subclass(_CudaLooking), 1, 512, False)  # 1-D
    assert not topk.supports_decode_topk(base[:, :0].as_subclass(_CudaLooking), 4, 512, False)  # no columns
    assert not topk.supports_decode_topk(base[:, :1024], 4, 512, False)  # CPU


def test_host_op_rejects_out_overlapping_its_inputs_or_itself():
    """Other CTAs write out while a row's CTAs (re-)read its logits and row end: out may share no byte with them, and
    its rows none with each other; disjoint parts of one buffer are fine."""
    from runtime.topk import decode_topk

    logits = torch.randn(3, 1024)
    ends = torch.tensor([1024, 700, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match="out overlaps logits"):
        decode_topk(logits, ends, logits.view(torch.int32)[:, :512])  # "in place" over the logits
    ws = torch.zeros(3, 1024, dtype=torch.int32)
    with pytest.raises(ValueError, match="out overlaps row_ends"):
        decode_topk(logits, ws[1, 500:503].copy_(ends), ws[:, :512])
    with pytest.raises(ValueError, match="out's rows overlap"):
        decode_topk(logits, ends, torch.empty(1, 512, dtype=torch.int32).expand(3, 512))
    with pytest.raises(ValueError, match="out's rows overlap"):
        decode_topk(logits, ends, ws.view(-1)[:1536].as_strided((3, 512), (256, 1)))
    with pytest.raises(ValueError, match="out's rows overlap"):  # two rows sharing one slot
        decode_topk(logits[:2], ends[:2], ws.view(-1)[:1023].as_strided((2, 512), (511, 1)))
    adjacent = ws.view(-1)[:1024].view(2, 512)  # row stride k: no slot shared
    decode_topk(logits[:2], ends[:2], adjacent)
    for r in range(2):
        assert adjacent[r].tolist() == _stable_sort_topk(logits[r], int(ends[r]), 512, False), r
    gap = ws[0, 600:603].copy_(ends)  # in the gap after out's first row: no overlap
    decode_topk(logits, gap, ws[:, :512])
    ref = decode_topk_reference(logits, ends, 512)
    assert torch.equal(torch.sort(ws[:, :512], 1).values, torch.sort(ref, 1).values)


@pytest.mark.parametrize("rows,grids,row_wave", [(264, [264], 132), (265, [133, 132], 132),
                                                  (600, [200, 200, 200], 132),
                                                  # a short-row kernel with the larger wave, past its width limit
                                                  (300, [150, 150], 396)])
def test_rows_past_one_wave_launch_a_wave_at_a_time(monkeypatch, rows, grids, row_wave):
    """More rows than one wave of any cached kernel holds (264: the H200's 1-CTA clusters) go as the fewest launches
    of even size, each with its rows' logits, ends and out, instead of the torch reference. The short-row kernel's
    wave (BF16 block mode: 396 on the H200) counts only for rows it takes (at most ROW_MAX_WIDTH columns)."""
    from runtime import topk

    plan = topk._Plan(_FakeCache(rows=True, row_most=row_wave), "f32", False)
    assert plan.most_rows(8192) == max(264, row_wave)
    assert plan.most_rows(topk.contract.ROW_MAX_WIDTH + 1) == 264
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: plan)
    launched = []
    monkeypatch.setattr(topk, "launch_on", lambda device, kernel, grid, *a: launched.append((grid, a)))

    def no_fallback(*a, **k):
        raise AssertionError("the torch reference ran")

    monkeypatch.setattr(topk, "decode_topk_reference", no_fallback)
    width, k = (8192 if row_wave < 264 else topk.contract.ROW_MAX_WIDTH + 8), 512
    logits = torch.zeros(rows, width).as_subclass(_CudaLooking)
    ends = torch.full((rows,), width, dtype=torch.int32)
    out = torch.empty(rows, k, dtype=torch.int32)
    checks = []
    check_args = topk._check_args
    monkeypatch.setattr(topk, "_check_args", lambda *a: checks.append(a) or check_args(*a))
    topk.decode_topk(logits, ends, out)
    assert [grid for grid, _ in launched] == grids  # one CTA a row (c1)
    assert len(checks) == 1, "the arguments are checked once, not again per launch"
    starts = [sum(grids[:i]) for i in range(len(grids))]
    assert [a[0] - logits.data_ptr() for _, a in launched] == [r * width * 4 for r in starts]
    assert [a[1] - ends.data_ptr() for _, a in launched] == [r * 4 for r in starts]
    assert [a[2] - out.data_ptr() for _, a in launched] == [r * k * 4 for r in starts]


def test_rows_past_one_wave_that_no_kernel_takes_go_to_the_reference(monkeypatch):
    """Logits the kernel cannot read (a 4-byte start) are not split into waves: one reference call writes them."""
    from runtime import topk

    plan = topk._Plan(_FakeCache(rows=True), "f32", False)
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: plan)
    monkeypatch.setattr(topk, "launch_on", lambda *a: pytest.fail("launched"))
    calls = []
    monkeypatch.setattr(topk, "decode_topk_reference", lambda lg, e, k, block_mode: calls.append(lg.shape[0]) or
                        torch.zeros(lg.shape[0], k, dtype=torch.int32))
    logits = torch.zeros(600, 8192 + 4)[:, 1:8193].as_subclass(_CudaLooking)
    with pytest.warns(RuntimeWarning, match="not a multiple of 16 bytes"):
        topk.decode_topk(logits, torch.full((600,), 8192, dtype=torch.int32), torch.empty(600, 512, dtype=torch.int32))
    assert calls == [600]


def test_layout_fallbacks_are_said(monkeypatch):
    """A call the cache could serve but whose layout the kernel cannot read runs the reference and says why (a
    RuntimeWarning naming the cause); CPU tensors and a device the cache refuses take the reference without it."""
    import warnings as w

    from runtime import topk

    plan = topk._Plan(_FakeCache(rows=True), "f32", False)
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: plan)
    monkeypatch.setattr(topk, "launch_on", lambda *a: pytest.fail("launched"))
    monkeypatch.setattr(topk, "decode_topk_reference",
                        lambda lg, e, k, block_mode: torch.zeros(lg.shape[0], k, dtype=torch.int32))
    ends = torch.full((2,), 1000, dtype=torch.int32)
    out = torch.empty(2, 512, dtype=torch.int32)
    cases = [
        (torch.zeros(2, 1025)[:, 1:].as_subclass(_CudaLooking), "start or row stride is not a multiple of 16"),
        (torch.zeros(2 * 1004).as_strided((2, 1001), (1002, 1)).as_subclass(_CudaLooking), "row stride is not"),
        (torch.zeros(1004 + 1001).as_strided((2, 1001), (1004, 1)).as_subclass(_CudaLooking), "ends past"),
        (torch.zeros(2, 8)[:, 1:2].as_subclass(_CudaLooking), "start or row stride is not"),  # one column too
    ]
    for logits, cause in cases:
        with pytest.warns(RuntimeWarning, match=f"decode_topk: .*{cause}.*exact torch reference") as said:
            topk.decode_topk(logits, ends, out)
        assert said[0].filename == __file__, "the warning names the caller's line"
    aligned = torch.zeros(2, 1024, device="meta").as_subclass(_CudaLooking)
    wide_out = torch.empty_strided((2, 512), (1 << 31, 1), dtype=torch.int32, device="meta")
    with pytest.warns(RuntimeWarning, match="out's row offsets are past int32"):
        topk.decode_topk(aligned, ends.to("meta"), wide_out)
    # Called from inside the runtime (the indexer's selection), the warning still names the caller's line: it named
    # runtime/indexer.py, where a filter by module or the once-per-line default could not tell one server from another.
    from runtime import indexer

    with pytest.warns(RuntimeWarning, match="decode_topk: .*start or row stride") as said:
        indexer._aot_select(cases[0][0], ends, out, False)
    assert said[0].filename == __file__, said[0].filename
    with w.catch_warnings():
        w.simplefilter("error")
        topk.decode_topk(torch.zeros(2, 1025)[:, 1:], ends, out)  # CPU: the reference is the op, nothing to say
        monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: None)  # refused: said once already
        topk.decode_topk(cases[0][0], ends, out)


def test_kernel_is_not_given_strides_past_int32_or_rows_past_the_storage(monkeypatch):
    """The kernel takes the row strides as int32 (ctypes wraps a larger one silently), offsets out's rows in int32,
    and reads each row's end rounded up to 16 bytes: such calls go to the fallback instead."""
    from runtime import topk

    class Plan:
        def choose(self, rows, width):
            return types.SimpleNamespace(name="decode_topk_f32_token_c1", in_stream_order=lambda: None), 1

    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: Plan())
    launched = []
    monkeypatch.setattr(topk, "launch_on", lambda *a: launched.append(a))
    wide = torch.empty_strided((2, 1024), (1 << 31, 1), device="meta").as_subclass(_CudaLooking)
    assert not topk.supports_decode_topk(wide, 2, 512, False)
    assert topk.supports_decode_topk(torch.empty(2, 1024, device="meta").as_subclass(_CudaLooking), 2, 512, False)
    # Rows of 1001 floats at a 16-byte stride, the storage ending at the last row's 1001st float.
    tight = torch.zeros(1004 + 1001).as_strided((2, 1001), (1004, 1)).as_subclass(_CudaLooking)
    assert not topk.supports_decode_topk(tight, 2, 512, False)
    padded = torch.zeros(2 * 1004).as_strided((2, 1001), (1004, 1)).as_subclass(_CudaLooking)
    assert topk.supports_decode_topk(padded, 2, 512, False)
    # A storage of bytes (a workspace viewed as BF16) may end off the element size: 9 BF16 (18 bytes) read as 32.
    for nbytes, takes in ((31, False), (32, True)):
        row = torch.zeros(nbytes, dtype=torch.uint8)[:18].view(torch.bfloat16).view(1, 9).as_subclass(_CudaLooking)
        assert topk.supports_decode_topk(row, 1, 512, False) == takes, nbytes
    # out's last row starting past int32 elements: the fallback writes it.
    logits = torch.empty(2, 1024, device="meta").as_subclass(_CudaLooking)
    ends = torch.empty(2, dtype=torch.int32, device="meta")
    with pytest.warns(RuntimeWarning, match="out's row offsets are past int32"):
        topk.decode_topk(logits, ends, torch.empty_strided((2, 512), (1 << 31, 1), dtype=torch.int32, device="meta"))
    assert not launched
    topk.decode_topk(logits, ends, torch.empty(2, 512, dtype=torch.int32, device="meta"))
    assert len(launched) == 1 and launched[0][-3:] == (1024, 512, 512)
    # One row: its strides offset nothing, so a row of a tensor whose strides pass int32 runs, given 0 for both.
    launched.clear()
    one_wide = torch.empty_strided((1, 1024), (1 << 31, 1), device="meta").as_subclass(_CudaLooking)
    assert topk.supports_decode_topk(one_wide, 1, 512, False)
    topk.decode_topk(one_wide, ends[:1], torch.empty_strided((1, 512), (1 << 31, 1), dtype=torch.int32, device="meta"))
    assert len(launched) == 1 and launched[0][-4:] == (1024, 0, 0, 512)
    # A cluster kernel's grid is its CTAs, cluster of them a row.
    launched.clear()
    c4 = types.SimpleNamespace(name="decode_topk_f32_token_c4", in_stream_order=lambda: None)
    monkeypatch.setattr(Plan, "choose", lambda self, rows, width: (c4, 4))
    topk.decode_topk(logits, ends, torch.empty(2, 512, dtype=torch.int32, device="meta"))
    assert len(launched) == 1 and launched[0][1] is c4 and launched[0][2] == 2 * 4


# Review addition: NaNs of either sign and any payload, and +inf. CUDA's canonical NaN is 0x7FFFFFFF and a negated
# NaN has the sign bit set: the kernel's key_of and its fast paths (whole_group_keys' probe, the packed BF16 test,
# raw_group_bins' setp.equ) must each treat every one as -inf; the reference too.
_F32_SPECIAL_BITS = (0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0xFF800001, 0x7F800000, 0xFF800000,
                     0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x00000001, 0x80000001)
_BF16_SPECIAL_BITS = (0x7FC0, 0xFFC0, 0x7FFF, 0xFFFF, 0x7F81, 0xFF81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x3F80, 0xBF80,
                      0x0001, 0x8001)


@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("f32", "bf16"))
def test_reference_nan_of_any_sign_or_payload_is_neg_inf(dtype, block_mode):
    bits = _F32_SPECIAL_BITS if dtype == torch.float32 else _BF16_SPECIAL_BITS
    itype = torch.int32 if dtype == torch.float32 else torch.int16
    rnd = random.Random(7)
    rows, width = 5, 77
    raw = [[rnd.choice(bits) for _ in range(width)] for _ in range(rows)]
    half = 1 << (31 if dtype == torch.float32 else 15)
    logits = torch.tensor([[b - 2 * half if b >= half else b for b in row] for row in raw], dtype=itype).view(dtype)
    values = logits.float().tolist()  # NaN stays NaN whatever its sign: _brute makes it -inf
    ends = torch.tensor([width, 40, 9, 1, 0], dtype=torch.int32)
    for k in (1, 8, 64):
        got = decode_topk_reference(logits, ends, k, block_mode=block_mode)
        for r in range(rows):
            assert got[r].tolist() == _brute(values[r], int(ends[r]), k, block_mode), (r, k)
    nan_keys = decode_topk_keys(logits)[torch.isnan(logits)]
    assert (nan_keys == decode_topk_keys(torch.tensor([float("-inf")]).to(dtype))[0]).all()


def test_refused_cache_is_said_once(monkeypatch):
    """A device the cache cannot serve sends decode_topk to the exact fallback: said once a (device, dtype, mode),
    not silently (a GPU test would otherwise compare the fallback with the reference)."""
    import runtime
    from runtime import topk

    def refuse(*a, **k):
        raise runtime.CacheError("no manifest for this device's arch")

    monkeypatch.setattr(runtime, "load", refuse)
    monkeypatch.setattr(topk, "_plans", {})
    monkeypatch.setattr(runtime.loader, "_bound", {})  # a fresh memo of bound devices
    monkeypatch.setattr(runtime.loader, "_refusals_said", set())
    device = torch.device("cuda", 0)
    with pytest.warns(RuntimeWarning, match="cannot serve cuda:0.*no manifest"):
        assert topk._plan_for(device, "f32", False) is None
    assert topk._plan_for(device, "f32", False) is None  # memoized: no second warning (pytest -W error would raise)


def test_plan_error_other_than_a_refusal_is_raised(monkeypatch):
    """Only the cache's refusals (CacheError) send decode_topk to the fallback; any other error (a bug) is raised,
    not turned into a silent slow path."""
    import runtime
    from runtime import topk

    def broken(*a, **k):
        raise AttributeError("a bug in the loader")

    monkeypatch.setattr(runtime, "load", broken)
    monkeypatch.setattr(topk, "_plans", {})
    monkeypatch.setattr(runtime.loader, "_bound", {})  # a fresh memo of bound devices
    monkeypatch.setattr(runtime.loader, "_refusals_said", set())
    with pytest.raises(AttributeError, match="a bug in the loader"):
        topk._plan_for(torch.device("cuda", 0), "f32", False)
    assert topk._plans == {}  # nothing memoized: the next call asks again


def test_rows_past_one_wave_whose_last_row_the_kernel_cannot_read_are_not_split(monkeypatch):
    """Rows past one wave whose last row's 16-byte-rounded read would leave the storage: the first row alone is
    readable, but the call must not be split into waves (the last slice would run the reference after the first
    slices were launched, its warning then raised past a launch where warnings are errors); one reference call
    writes every row, said before anything launches."""
    import warnings as w

    from runtime import topk

    plan = topk._Plan(_FakeCache(rows=True), "f32", False)
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: plan)
    events = []
    monkeypatch.setattr(topk, "launch_on", lambda device, kernel, grid, *a: events.append(("launch", grid)))
    monkeypatch.setattr(topk, "decode_topk_reference", lambda lg, e, k, block_mode: events.append(
        ("reference", lg.shape[0])) or torch.zeros(lg.shape[0], k, dtype=torch.int32))
    rows, width, stride = 600, 1001, 1004  # 4004-byte rows at a 4016-byte stride, the storage ending at the last row
    logits = torch.zeros((rows - 1) * stride + width).as_strided((rows, width), (stride, 1)).as_subclass(_CudaLooking)
    assert topk._kernel_for(logits, 1, 512, False) is not None  # the first row alone: the kernel would take it
    ends = torch.full((rows,), width, dtype=torch.int32)
    out = torch.empty(rows, 512, dtype=torch.int32)
    with w.catch_warnings():
        w.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="ends past their storage"):
            topk.decode_topk(logits, ends, out)
    assert events == [], "nothing may launch before the warning"
    with pytest.warns(RuntimeWarning, match="ends past their storage"):
        topk.decode_topk(logits, ends, out)
    assert events == [("reference", rows)]


# Review addition: a sparse-layout argument is refused with a TypeError naming it. A CSR tensor has no strides (its
# stride() raised a RuntimeError naming nothing) and a COO one reported strides (0, 0).
@pytest.mark.parametrize("layout", ("coo", "csr"))
@pytest.mark.parametrize("name", ("logits", "row_ends", "out"))
def test_host_op_rejects_sparse_layouts(name, layout):
    from runtime.topk import decode_topk, decode_topk_plan, supports_decode_topk

    args = {"logits": torch.randn(3, 1000), "row_ends": torch.tensor([1000, 5, 0], dtype=torch.int32),
            "out": torch.empty(3, 512, dtype=torch.int32)}
    t = args[name]
    if layout == "csr" and t.dim() != 2:
        pytest.skip("CSR is 2-D only")
    args[name] = t.to_sparse() if layout == "coo" else t.to_sparse_csr()
    with pytest.raises(TypeError, match=rf"^{name} must be a dense \(strided\) tensor"):
        decode_topk(args["logits"], args["row_ends"], args["out"])
    if name == "logits":
        assert supports_decode_topk(args["logits"], 3, 512, False) is False
        assert decode_topk_plan(args["logits"], 3, 512, False) is None


# Review addition (fifty-first session): a nested tensor and a lazily negated view (the kernel would read the memory,
# which holds the values un-negated: the top-k of the negated logits is their bottom-k) are refused naming them.
@pytest.mark.parametrize("kind", ("nested", "negated"))
@pytest.mark.parametrize("name", ("logits", "row_ends", "out"))
def test_host_op_rejects_nested_and_negated_tensors(name, kind):
    import warnings

    from runtime.topk import decode_topk, decode_topk_plan, supports_decode_topk

    args = {"logits": torch.randn(3, 1000), "row_ends": torch.tensor([1000, 5, 0], dtype=torch.int32),
            "out": torch.empty(3, 512, dtype=torch.int32)}
    if kind == "negated":
        args[name] = torch._neg_view(args[name])
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: the strided nested layout is a prototype
            args[name] = torch.nested.nested_tensor([args[name]], layout=torch.strided)
    fix = "allocate out as a plain dense tensor" if name == "out" else f"{name}.resolve_neg"  # out: no copy
    with pytest.raises(TypeError, match=rf"^{name} (must be a dense \(strided\) tensor, got a nested|is a lazily "
                                        rf"negated view.*{fix})"):
        decode_topk(args["logits"], args["row_ends"], args["out"])
    if name == "logits":
        assert supports_decode_topk(args["logits"], 3, 512, False) is False
        assert decode_topk_plan(args["logits"], 3, 512, False) is None


# Review addition: the queries check rows, k and block_mode as the op checks its arguments (runtime.arguments): int()
# took 3.7 rows as 3 and True as k = 1, bool() the string "False" as block mode, answering for another call.
def test_queries_refuse_non_integer_rows_and_k_and_non_bool_block_mode(monkeypatch):
    np = pytest.importorskip("numpy")
    from runtime import topk

    class Plan:
        def choose(self, rows, width):
            return (types.SimpleNamespace(name="decode_topk_f32_token_c2"), 2) if 0 < rows <= 132 else None

    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: Plan())
    ok = torch.zeros(4, 1024).as_subclass(_CudaLooking)
    for query in (topk.supports_decode_topk, topk.decode_topk_plan):
        for logits in (ok, torch.zeros(4, 1024)):  # refused whatever the answer would be (CPU: False)
            with pytest.raises(TypeError, match=r"^rows: expected an integer, got float 3\.7"):
                query(logits, 3.7, 512, False)
            with pytest.raises(TypeError, match="^rows: expected an integer, got the bool True"):
                query(logits, True, 512, False)
            with pytest.raises(ValueError, match="^rows: expected an integer >= 0, got -1"):
                query(logits, -1, 512, False)
            with pytest.raises(TypeError, match=r"^k: expected an integer, got float 512\.0"):
                query(logits, 4, 512.0, False)
            with pytest.raises(TypeError, match="^k: expected an integer, got the bool True"):
                query(logits, 4, True, False)
            for flag in ("False", 0, np.bool_(False)):
                with pytest.raises(TypeError, match="^block_mode must be a Python bool"):
                    query(logits, 4, 512, flag)
    # Any integer type is taken, as the op's other counts are.
    assert topk.supports_decode_topk(ok, np.int64(4), np.int32(512), False)
    assert topk.decode_topk_plan(ok, np.int64(4), torch.tensor(512), False) == ("decode_topk_f32_token_c2", 2, 8)
    assert not topk.supports_decode_topk(ok, 0, 512, False)


# Review addition: runtime.arguments refuses a bool tensor as it refuses a bool: torch.tensor(True) (a mask's any())
# passed operator.index as 1, so supports_decode_topk answered for one row.
def test_counts_refuse_bool_tensors():
    from runtime.arguments import whole_count, whole_number
    from runtime.topk import supports_decode_topk

    for flag in (torch.tensor(True), torch.tensor([False])):
        with pytest.raises(TypeError, match="^rows: expected an integer, got the bool tensor"):
            supports_decode_topk(torch.zeros(4, 1024), flag, 512, False)
        with pytest.raises(TypeError, match="^n: expected an integer, got the bool tensor"):
            whole_count("n", flag, 0)
    assert whole_number("n", torch.tensor(3, dtype=torch.int32)) == 3  # an integer tensor is still a count


# A count held by a tensor off the CPU is refused, not read: reading it waits for the device (and raises an unrelated
# error during CUDA-graph capture). The meta device stands in for CUDA on CI; test_topk_gpu.py passes a CUDA one.
def test_counts_refuse_device_tensors():
    from runtime.arguments import whole_count, whole_number
    from runtime.topk import supports_decode_topk

    count = torch.tensor(4, dtype=torch.int32, device="meta")
    with pytest.raises(TypeError, match=r"^n: expected an integer, got a tensor on meta; pass a Python int"):
        whole_number("n", count)
    with pytest.raises(TypeError, match=r"^rows: expected an integer, got a tensor on meta; pass a Python int"):
        supports_decode_topk(torch.zeros(4, 1024), count, 512, False)
    with pytest.raises(TypeError, match=r"^n: expected an integer, got a tensor on meta"):
        whole_count("n", count, 0)
    with pytest.raises(TypeError, match=r"^n: expected an integer, got a tensor on meta"):  # not its repr first
        whole_number("n", torch.tensor(True, device="meta"))


# Review addition: the op (its CPU path) and the reference against the brute-force definition on ugly shapes: row ends
# at int32's extremes and around the width and block edges, k equal to the width (or the blocks), all-equal rows,
# NaN and infinities, a padded out, and no rows or no columns at all.
_UGLY_ENDS = (-(1 << 31), -1, 0, 1, 7, 8, 9)


def _ugly_ends(width):
    return torch.tensor(_UGLY_ENDS + (width - 1, width, width + 1, (1 << 31) - 1), dtype=torch.int32)


@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("f32", "bf16"))
@pytest.mark.parametrize("width,pool", [(512, SPECIALS), (511, SPECIALS), (600, (3.0,)), (4096, SPECIALS),
                                        (4095, (float("-inf"), float("nan"))), (4100, (1.0, float("inf")))])
def test_host_op_matches_brute_force_on_ugly_shapes(dtype, block_mode, width, pool):
    from runtime.topk import decode_topk

    ends = _ugly_ends(width)
    rows, k = ends.shape[0], 512
    logits, values = _rows(width, rows, width, dtype, pool)
    buf = torch.full((rows, k + 16), -7, dtype=torch.int32)
    decode_topk(logits, ends, buf[:, :k], block_mode=block_mode)
    assert (buf[:, k:] == -7).all(), "out's row padding was written"
    ref = decode_topk_reference(logits, ends, k, block_mode=block_mode)
    for r in range(rows):
        want = _brute(values[r], int(ends[r]), k, block_mode)
        assert ref[r].tolist() == want, r  # the reference: best first
        assert sorted(buf[r, :k].tolist()) == sorted(want), r  # the op: the same set


@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
def test_reference_k_around_the_width(block_mode):
    for width in (1, 7, 8, 9, 16, 17):
        logits, values = _rows(width, 11, width, torch.float32, SPECIALS)
        ends = _ugly_ends(width)
        items = -(-width // 8) if block_mode else width
        for k in (1, items - 1, items, items + 1):
            if k < 1:
                continue
            got = decode_topk_reference(logits, ends, k, block_mode=block_mode)
            assert [got[r].tolist() for r in range(11)] == [_brute(values[r], int(ends[r]), k, block_mode)
                                                             for r in range(11)], (width, k)


def test_host_op_takes_no_rows_or_no_columns():
    from runtime.topk import decode_topk

    out = torch.empty(0, 512, dtype=torch.int32)
    decode_topk(torch.zeros(0, 600), torch.zeros(0, dtype=torch.int32), out)  # nothing to write, nothing refused
    with pytest.raises(ValueError, match="k = out.shape"):
        decode_topk(torch.zeros(0, 600), torch.zeros(0, dtype=torch.int32), torch.empty(0, 100, dtype=torch.int32))
    for block_mode in (False, True):
        out = torch.zeros(3, 512, dtype=torch.int32)
        decode_topk(torch.zeros(3, 0), torch.tensor([0, 5, -5], dtype=torch.int32), out, block_mode=block_mode)
        assert (out == -1).all()


# Review addition: the widest rows the op takes (MAX_WIDTH = 2^21 - 1 columns), against a stable sort by value. The
# reference ranks (key << 31) | (2^31 - 1 - index), the kernels break ties over 21 index bits: every other CPU test
# stays under 4200 columns, so an index packing of 20 bits (wrong from column 2^20 on) passed them all. Ties cross
# column 2^20, the best value sits in the last column, a row ends just past 2^20; width 2^21 is refused by the op
# (past the kernels' 21 bits) and taken by the reference.
def _stable_sort_topk(logits, end, k, block_mode):
    """Larger value first, lower index among equals (a stable sort), NaN as -inf; -1 past the candidates."""
    v = logits[: max(0, min(end, logits.shape[0]))].double()
    v = torch.where(torch.isnan(v), torch.full_like(v, float("-inf")), v)
    if block_mode:
        pad = -v.shape[0] % 8
        v = torch.cat([v, torch.full((pad,), float("-inf"), dtype=v.dtype)]).view(-1, 8).amax(dim=1)
    order = torch.sort(v, descending=True, stable=True).indices[:k].tolist()
    return order + [-1] * (k - len(order))


@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
def test_reference_and_op_at_the_width_limit(block_mode):
    from runtime.topk import MAX_WIDTH, decode_topk

    width, half, k = MAX_WIDTH, 1 << 20, 2048
    assert width == (1 << 21) - 1
    g = torch.Generator().manual_seed(21)
    logits = torch.randint(-3, 4, (4, width), generator=g).float()
    logits[0] = (torch.arange(width) >= half).float()  # one tie from column 2^20 on: the lowest indices there win
    logits[1, torch.randint(0, width, (5000,), generator=g)] = float("nan")
    logits[1, -1] = float("inf")  # the last column is the best
    logits[2] = torch.randn(width, generator=g).mul(4).round()
    ends = torch.tensor([width, width, half + 5, width - 9], dtype=torch.int32)
    got = decode_topk_reference(logits, ends, k, block_mode=block_mode)
    out = torch.full((4, k), -7, dtype=torch.int32)
    decode_topk(logits, ends, out, block_mode=block_mode)
    for r in range(4):
        want = _stable_sort_topk(logits[r], int(ends[r]), k, block_mode)
        assert got[r].tolist() == want, r
        assert sorted(out[r].tolist()) == sorted(want), r
    if not block_mode:
        assert got[0, 0] == half and got[1, 0] == width - 1
    too_wide = torch.zeros(1, width + 1)  # the reference takes it (past the kernels' limit), the op refuses it
    assert decode_topk_reference(too_wide, torch.ones(1, dtype=torch.int32), k)[0, :2].tolist() == [0, -1]
    with pytest.raises(ValueError, match="width 2097152 exceeds 2097151 columns"):
        decode_topk(too_wide, torch.ones(1, dtype=torch.int32), torch.empty(1, k, dtype=torch.int32))


def test_crowded_warp_slices_overflow_only_the_list_share():
    """The GPU tests' and sanitizer's crowded-warp rows (benchmarks/step1_list_emulation.py: crowded_warp_slice) do
    what they claim, in the CPU emulation of step 1's warp loop: on a CROWDED_CTA_COLUMNS slice (the warp loop's, past
    the twins' table) one warp holds more than LIST_CAPACITY's share, so with a list of LIST_CAPACITY a CTA gives its
    list up (at any spread of the warps' speeds), and with the twins' TWIN_LIST_CAPACITY (1024 slots a warp, refreshing
    at LIST_CAPACITY's share as the kernel does) keeps it."""
    from benchmarks.step1_list_emulation import (
        CROWDED_CTA_COLUMNS,
        WARPS,
        crowded_warp_slice,
        emulate_cta,
    )
    from runtime.contract.decode_topk import (
        LIST_CAPACITY,
        TWIN_LIST_CAPACITY,
        warp_step1_min_groups,
    )

    assert CROWDED_CTA_COLUMNS // 8 >= warp_step1_min_groups(False, 1)  # the twins' warp loop
    assert TWIN_LIST_CAPACITY == 1024 * WARPS

    for k in (1024, 2048):
        g = torch.Generator().manual_seed(k)
        bins = decode_topk_keys(crowded_warp_slice(CROWDED_CTA_COLUMNS, k, g)) >> 21
        for spread in (0.0, 0.2, 0.5):
            speeds = (1 + spread * torch.randn(WARPS, generator=g)).clamp(min=0.3).tolist()
            assert emulate_cta(bins, k, LIST_CAPACITY, LIST_CAPACITY, speeds), (k, spread)
            assert not emulate_cta(bins, k, TWIN_LIST_CAPACITY, LIST_CAPACITY, speeds), (k, spread)


def test_load_kernels_checks_its_arguments_before_loading(monkeypatch):
    """load_kernels passed its arguments to the loader unchecked: "cuda:0" sent str.index as the device, float16 a
    bare KeyError, and block_mode="False" (truthy) loaded the block-mode kernels, leaving token mode to load at its
    first call, perhaps inside a CUDA-graph capture. Each is refused naming the argument; an index or its string
    loads the same plan."""
    from runtime import topk

    asked = []
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: asked.append((device, dtype, block_mode)))
    topk.load_kernels("cuda:0", torch.float32, False)
    topk.load_kernels(0, torch.bfloat16, True)
    topk.load_kernels(torch.device("cuda", 1), torch.float32, False)
    assert asked == [(torch.device("cuda", 0), "f32", False), (torch.device("cuda", 0), "bf16", True),
                     (torch.device("cuda", 1), "f32", False)]
    for args, exc, match in [(("cuda:0", torch.float16, False), TypeError, r"^dtype: .*float32 or .*bfloat16"),
                             (("cuda:0", torch.float32, "False"), TypeError, r"^block_mode must be a Python bool"),
                             (("cpu", torch.float32, False), ValueError, r"^device: cpu is not a CUDA device"),
                             ((True, torch.float32, False), TypeError, r"\bdevice\b"),
                             # torch would wrap both onto cuda:0 and load its kernels in their place
                             ((256, torch.float32, False), ValueError, r"^device: device index 256 is past"),
                             (("cuda:256", torch.float32, False), ValueError, r"^device: 'cuda:256' names a device")]:
        with pytest.raises(exc, match=match):
            topk.load_kernels(*args)
    assert len(asked) == 3


@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
def test_rows_wider_than_the_kernels_go_to_the_reference_the_refusal_names(block_mode):
    """The op refuses rows past MAX_WIDTH and names decode_topk_reference for them, which refused the same widths
    (it ranked over 21 index bits): it ranks over 31 now, exact past 2**21 columns, ties to the lower index."""
    from runtime import topk

    width = (1 << 21) + 24
    logits = torch.zeros(1, width)
    ends = torch.tensor([width - 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"select from longer rows with runtime\.reference\.decode_topk_reference"):
        topk.decode_topk(logits, ends, torch.empty(1, 512, dtype=torch.int32), block_mode=block_mode)
    logits[0, [5, width - 8, width - 4, width - 2]] = torch.tensor([2.0, 3.0, 3.0, 9.0])  # the last past the end
    got = decode_topk_reference(logits, ends, 3, block_mode=block_mode)
    if block_mode:  # blocks of 8: the two 3.0s share the last block before the end, ties go to the lower block
        last = (width - 8) // 8
        assert got.tolist() == [[last, 0, 1]]
    else:
        assert got.tolist() == [[width - 8, width - 4, 5]]
    with pytest.raises(ValueError, match=r"width 2147483648 exceeds 2147483647 columns"):
        decode_topk_reference(torch.empty(1, 1 << 31, device="meta"), ends, 3)


def test_kernel_write_bumps_outs_version(monkeypatch):
    """The kernel writes out through its pointer: the op bumps out's version counter (a view's, which is its base's),
    as the fallback's copy_ does, wave by wave too, so autograd never uses values saved from out before the call."""
    from runtime import topk

    plan = topk._Plan(_FakeCache(rows=True), "f32", False)
    monkeypatch.setattr(topk, "_plan_for", lambda device, dtype, block_mode: plan)
    launched = []
    monkeypatch.setattr(topk, "launch_on", lambda device, kernel, grid, *a: launched.append(grid))
    buffer = torch.zeros(600, 512, dtype=torch.int32)
    for rows, grids in ((2, [2]), (600, [200, 200, 200])):
        logits = torch.zeros(rows, 8192).as_subclass(_CudaLooking)
        before = buffer._version
        topk.decode_topk(logits, torch.full((rows,), 8192, dtype=torch.int32), buffer[:rows])
        assert launched[-len(grids):] == grids
        assert buffer._version >= before + len(grids), rows


def test_reference_refuses_bad_k_and_row_ends_naming_them():
    """The exact selection is public (the host ops' fallback, and what decode_topk names for rows past its width): a
    negative or non-integer k and row_ends of another length raised torch's RuntimeError, naming no argument, or
    broadcast one end over every row."""
    logits = torch.randn(3, 40)
    ends = torch.full((3,), 40, dtype=torch.int32)
    with pytest.raises(ValueError, match="k: expected an integer >= 0, got -1"):
        decode_topk_reference(logits, ends, -1)
    # TypeErrors naming k, as the host ops' checks give; a bool tensor passed as k = 1
    for k in (2.0, True, None, torch.tensor(True), torch.tensor(4.0), torch.tensor([4, 5])):
        with pytest.raises(TypeError, match="^k: "):
            decode_topk_reference(logits, ends, k)
    for bad in (ends[:1], ends[:2], ends.view(3, 1)):
        with pytest.raises(ValueError, match=r"row_ends must be \[rows\] = \[3\]"):
            decode_topk_reference(logits, bad, 4)
    assert decode_topk_reference(logits, ends, 0).shape == (3, 0)
    import numpy as np
    assert torch.equal(decode_topk_reference(logits, ends, np.int64(5)), decode_topk_reference(logits, ends, 5))
