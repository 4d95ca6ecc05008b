"""Time decode_topk kernels of several cache roots side by side on chosen cases (helper of gpu jobs).

usage: topk_roots.py OUT.json ROOT [ROOT ...]

Each root is a cache folder (cubins/ + manifests/); "." is the committed cache. Every
case is launched directly (no host op) in CUDA graphs with rotated inputs, as
benchmarks/bench_topk.py does, so experimental builds (e.g. one stopping after a
phase) are compared on the same inputs in one process.
"""
import json
import os
import sys

import torch

from benchmarks import common
from runtime.loader import load

CASES = (  # kernel, rows, length, k
    ("decode_topk_f32_token_c2", 1, 8192, 512),
    ("decode_topk_f32_token_c4", 1, 16384, 2048),
    ("decode_topk_f32_token_c16", 1, 65536, 2048),
    ("decode_topk_f32_token_c16", 1, 262144, 2048),
    ("decode_topk_f32_token_c8", 8, 65536, 2048),
    ("decode_topk_f32_token_c8", 8, 1 << 20, 2048),
    ("decode_topk_f32_token_c2", 64, 16384, 2048),
    ("decode_topk_f32_token_c2", 64, 262144, 2048),
    ("decode_topk_f32_token_c8", 8, 262144, 512),
    ("decode_topk_f32_token_c8", 14, 262144, 2048),
    ("decode_topk_f32_token_c2", 64, 65536, 512),
    ("decode_topk_f32_token_c1", 256, 65536, 2048),
    ("decode_topk_f32_token_c16", 1, 1 << 20, 2048),
    ("decode_topk_bf16_token_c16", 1, 262144, 2048),
    ("decode_topk_bf16_token_c16", 1, 1 << 20, 2048),
    ("decode_topk_bf16_token_c8", 8, 65536, 512),
    ("decode_topk_bf16_token_c2", 64, 262144, 2048),
)


def beside(shapes, clusters, dtype="f32"):
    """(kernel, rows, length, k) cases: each shape (rows, length, k) on each cluster size, token mode;
    a shape may lead with its own dtype: (dtype, rows, length, k)."""
    cases = []
    for shape in shapes:
        d, rest = (shape[0], shape[1:]) if isinstance(shape[0], str) else (dtype, shape)
        cases += [(f"decode_topk_{d}_token_c{c}", *rest) for c in clusters]
    return tuple(cases)


# TOPK_ROOTS_CASES=occupancy: the same work per SM at one and at two CTAs an SM.
OCCUPANCY_CASES = (
    ("decode_topk_f32_token_c2", 64, 262144, 2048),
    ("decode_topk_f32_token_c2", 128, 131072, 2048),
    ("decode_topk_f32_token_c2", 64, 131072, 2048),
    ("decode_topk_f32_token_c2", 128, 65536, 2048),
    ("decode_topk_f32_token_c8", 8, 262144, 2048),
    ("decode_topk_f32_token_c8", 16, 131072, 2048),
)


# TOPK_ROOTS_CASES=small: cluster sizes side by side on short rows (the op's routing).
SMALL_CASES = beside(((1, 4096, 512), (8, 4096, 512), (64, 4096, 512), (1, 8192, 512), (8, 8192, 512),
                      (64, 8192, 512), (1, 16384, 2048), (64, 16384, 2048), (8, 32768, 2048)), (1, 2, 4))
# TOPK_ROOTS_CASES=bf16: BF16 token mode on every cluster size (the warp loop's unit of groups).
BF16_CASES = tuple(
    (f"decode_topk_bf16_token_c{c}", rows, length, k)
    for c, rows, length, k in ((1, 256, 65536, 2048), (1, 128, 262144, 512), (2, 64, 262144, 2048),
                               (2, 64, 262144, 512), (2, 64, 65536, 512), (2, 64, 1 << 20, 512), (4, 1, 16384, 512),
                               (4, 8, 16384, 2048), (8, 8, 65536, 512), (8, 8, 262144, 512), (8, 8, 262144, 2048),
                               (8, 14, 1 << 20, 512),
                               (16, 1, 65536, 2048), (16, 1, 262144, 512), (16, 1, 262144, 2048),
                               (16, 1, 1 << 20, 2048))
)
# TOPK_ROOTS_CASES=wide: 8 against 16 CTAs a row on a few rows (both one CTA an SM; the op's routing).
WIDE_CASES = tuple(
    (f"decode_topk_{dtype}_token_c{c}", rows, length, k)
    for dtype in ("f32", "bf16")
    for rows in (3, 4, 6, 8)
    for length in (65536, 262144, 1 << 20)
    for k in (512, 2048)
    for c in (8, 16)
    if dtype == "f32" or (rows == 8 and k == 2048)
)
# TOPK_ROOTS_CASES=c12: 12 CTAs a row beside 8 and 16 (8 rows: one wave of 16 holds 7 on the H200).
C12_CASES = beside(((8, 65536, 2048), (8, 262144, 512), (8, 262144, 2048), (8, 1 << 20, 512), (8, 1 << 20, 2048),
                    (6, 1 << 20, 2048), (6, 262144, 2048), (10, 1 << 20, 2048), (11, 262144, 2048),
                    ("bf16", 8, 262144, 2048), ("bf16", 8, 1 << 20, 512), ("bf16", 8, 1 << 20, 2048)), (8, 12, 16))
# TOPK_ROOTS_CASES=c8to11: 8 against 9, 10 and 11 CTAs a row where 8 rows do not fit one wave of 16.
C8TO11_CASES = beside(((8, 262144, 512), (8, 262144, 2048), (8, 1 << 20, 512), (8, 1 << 20, 2048), (14, 262144, 2048),
                       (14, 1 << 20, 2048), ("bf16", 8, 1 << 20, 2048), ("bf16", 8, 262144, 2048)), (8, 9, 10, 11))
# TOPK_ROOTS_CASES=c9: 8 against 9 CTAs a row on the rows one wave of 16 cannot hold (8 and 9 of them), 256K to 1M,
# both dtypes, token and block mode.
C9_CASES = beside(((8, 262144, 512), (8, 262144, 2048), (8, 524288, 2048), (8, 1 << 20, 512), (8, 1 << 20, 2048),
                   (9, 1 << 20, 2048), ("bf16", 8, 262144, 2048), ("bf16", 8, 524288, 2048), ("bf16", 8, 1 << 20, 512),
                   ("bf16", 8, 1 << 20, 2048), ("bf16", 9, 1 << 20, 2048)), (8, 9)) + tuple(
    (f"decode_topk_{d}_block_c{c}", 8, 1 << 20, k) for d in ("f32", "bf16") for k in (512, 2048) for c in (8, 9))
# TOPK_ROOTS_CASES=table_gate: FP32 launches of 64 MiB on the one-CTA-an-SM twins (past the 60 MiB the table was once
# held to), beside one of 56 MiB.
TABLE_GATE_CASES = (("decode_topk_f32_token_c2_full_sm", 64, 262144, 512),
                    ("decode_topk_f32_token_c2_full_sm", 64, 262144, 2048),
                    ("decode_topk_f32_token_c4_full_sm", 32, 524288, 2048),
                    ("decode_topk_f32_token_c2_full_sm", 56, 262144, 2048))
# TOPK_ROOTS_CASES=share: the cluster sizes whose step-1 warp loop shares one bound (1, 8, 16), FP32 and BF16.
SHARE_CASES = (
    ("decode_topk_f32_token_c1", 256, 65536, 512), ("decode_topk_f32_token_c1", 128, 262144, 2048),
    ("decode_topk_f32_token_c8", 8, 262144, 2048), ("decode_topk_f32_token_c8", 8, 1 << 20, 512),
    ("decode_topk_f32_token_c8", 14, 1 << 20, 2048), ("decode_topk_f32_token_c8", 14, 262144, 512),
    ("decode_topk_f32_token_c16", 1, 262144, 512), ("decode_topk_f32_token_c16", 1, 1 << 20, 512),
    ("decode_topk_bf16_token_c8", 8, 262144, 2048), ("decode_topk_bf16_token_c8", 14, 1 << 20, 512),
    ("decode_topk_bf16_token_c16", 1, 262144, 512), ("decode_topk_bf16_token_c1", 256, 65536, 2048),
)
# TOPK_ROOTS_CASES=short: slices of the CTA-tile step 1 (under 16K columns a CTA), one tile and more, both
# dtypes and modes, on the cluster sizes the op routes them to.
SHORT_CASES = (
    ("decode_topk_f32_token_c4", 1, 8192, 512),
    ("decode_topk_f32_token_c4", 8, 8192, 512),
    ("decode_topk_f32_token_c2", 64, 8192, 512),
    ("decode_topk_f32_token_c4", 1, 16384, 2048),
    ("decode_topk_f32_token_c16", 1, 65536, 512),
    ("decode_topk_f32_token_c16", 1, 65536, 2048),
    ("decode_topk_f32_token_c8", 8, 65536, 512),
    ("decode_topk_f32_token_c8", 14, 65536, 2048),
    ("decode_topk_f32_token_c2", 64, 16384, 2048),
    ("decode_topk_f32_token_c1", 128, 4096, 512),
    ("decode_topk_bf16_token_c16", 1, 65536, 512),
    ("decode_topk_bf16_token_c16", 1, 65536, 2048),
    ("decode_topk_bf16_token_c8", 8, 65536, 512),
    ("decode_topk_bf16_token_c2", 64, 16384, 512),
    ("decode_topk_f32_block_c16", 1, 65536, 512),
    ("decode_topk_f32_block_c4", 8, 65536, 2048),
    ("decode_topk_bf16_block_c16", 1, 262144, 2048),
)
# TOPK_ROOTS_CASES=mid: slices of 16K to 64K columns a CTA (warp loop or CTA tiles, by warp_step1_min_groups).
MID_CASES = (
    ("decode_topk_f32_token_c16", 1, 262144, 512),
    ("decode_topk_f32_token_c16", 1, 262144, 2048),
    ("decode_topk_f32_token_c8", 8, 262144, 512),
    ("decode_topk_f32_token_c8", 8, 262144, 2048),
    ("decode_topk_f32_token_c8", 14, 262144, 2048),
    ("decode_topk_f32_token_c2", 64, 65536, 512),
    ("decode_topk_f32_token_c2", 64, 65536, 2048),
    ("decode_topk_f32_token_c16", 1, 1 << 20, 512),
    ("decode_topk_f32_token_c16", 1, 1 << 20, 2048),
    ("decode_topk_f32_token_c2", 64, 131072, 2048),
    ("decode_topk_bf16_token_c16", 1, 262144, 512),
    ("decode_topk_bf16_token_c8", 8, 262144, 2048),
    ("decode_topk_bf16_token_c2", 64, 65536, 512),
    ("decode_topk_bf16_token_c16", 1, 1 << 20, 512),
    ("decode_topk_f32_block_c16", 1, 1 << 20, 2048),
)
# TOPK_ROOTS_CASES=row: the short-row kernel (one CTA a row) beside cluster sizes 1, 2 and 4 (the op's routing).
ROW_CASES = tuple(
    (f"decode_topk_{d}_{mode}_{c}", rows, length, k)
    for d in ("f32", "bf16")
    for mode, shapes in (("token", [(r, n, 512) for r in (1, 8, 64, 132) for n in (2048, 4096, 8192, 16384)]
                          + [(r, n, 2048) for r in (1, 8, 64, 132) for n in (8192, 16384)]),
                         ("block", [(r, n, 512) for r in (1, 64) for n in (8192, 16384)]))
    for rows, length, k in shapes
    for c in ("row", "c1", "c2", "c4")
)
# TOPK_ROOTS_CASES=row_only: the short-row kernel's cases of "row" alone (a change to it, beside no cluster size).
ROW_ONLY_CASES = tuple(case for case in ROW_CASES if case[0].endswith("_row"))
# TOPK_ROOTS_CASES=wave16: 8 to 14 rows on 8 and 16 CTAs a row (a candidate cache compiled for two CTAs an SM
# holds them in one wave of 16).
WAVE16_CASES = beside(((8, 65536, 512), (8, 65536, 2048), (8, 262144, 512), (8, 262144, 2048), (8, 1 << 20, 2048),
                       (14, 65536, 512), (14, 262144, 2048), ("bf16", 8, 65536, 512), ("bf16", 8, 262144, 2048)),
                      (8, 16))
# The benchmark's cells of length >= 64K (but 64 x 1M) on the kernels the host op routes them to.
LONG_CASES = tuple(
    (f"decode_topk_{d}_token_c{c}", rows, length, k)
    for d in ("f32", "bf16")
    for rows, c, lengths in ((1, 16, (65536, 262144, 1 << 20)), (8, 8, (65536, 262144, 1 << 20)),
                             (14, 8, (262144, 1 << 20)), (64, 2, (65536, 262144)))
    for length in lengths
    for k in (512, 2048)
)
# TOPK_ROOTS_CASES=routed: the long cells of the benchmark on the kernels its routing picks (the table's one-CTA-an-SM
# variants: 16 CTAs for one row, 8 for 8 and 14 rows, the 2-CTA twin for 64 rows).
ROUTED_CASES = tuple(
    (f"decode_topk_{d}_token_{kernel}", rows, length, k)
    for d in ("f32", "bf16")
    for rows, kernel, lengths in ((1, "c16", (65536, 262144, 1 << 20)), (8, "c8", (65536, 262144, 1 << 20)),
                                  (14, "c8", (65536, 262144, 1 << 20)), (64, "c2_full_sm", (65536, 262144)))
    for length in lengths
    for k in (512, 2048)
)
# TOPK_ROOTS_CASES=c2: the 2-CTA and 1-CTA variants' other long slices (64 x 1M, 32 x 128K, 256 x 64K), beside "long".
C2_CASES = (
    ("decode_topk_f32_token_c2", 64, 1 << 20, 2048),
    ("decode_topk_bf16_token_c2", 64, 1 << 20, 512),
    ("decode_topk_f32_token_c2", 32, 131072, 2048),
    ("decode_topk_f32_token_c2", 128, 65536, 2048),
    ("decode_topk_f32_token_c1", 256, 65536, 2048),
    ("decode_topk_bf16_token_c1", 256, 65536, 512),
)
# TOPK_ROOTS_CASES=twin: the 1-, 2- and 4-CTA kernels beside their one-CTA-an-SM twins ("_full_sm").
TWIN_CASES = tuple(
    (f"decode_topk_{d}_token_c{c}{twin}", rows, length, k)
    for d, c, rows, length, k in (("f32", 2, 64, 65536, 512), ("bf16", 2, 64, 65536, 2048), ("f32", 2, 64, 262144, 512),
                                  ("f32", 2, 64, 262144, 2048), ("bf16", 2, 64, 262144, 512),
                                  ("bf16", 2, 64, 262144, 2048), ("f32", 2, 64, 1 << 20, 2048),
                                  ("f32", 2, 32, 131072, 2048), ("f32", 2, 48, 65536, 512),
                                  ("f32", 4, 1, 16384, 2048), ("f32", 4, 8, 16384, 512), ("f32", 4, 16, 262144, 2048),
                                  ("f32", 4, 32, 131072, 2048), ("bf16", 4, 24, 262144, 512),
                                  ("f32", 1, 128, 65536, 2048), ("f32", 1, 100, 262144, 512),
                                  ("bf16", 1, 128, 65536, 512))
    for twin in ("", "_full_sm")
)
# TOPK_ROOTS_CASES=twinmin: the twins against the two-CTA builds at 8K and 16K columns a CTA (the routing threshold).
TWINMIN_CASES = tuple(
    (f"decode_topk_{d}_token_c{c}{twin}", rows, length, k)
    for d, c, rows, length, k in (("f32", 2, 64, 32768, 2048), ("f32", 2, 64, 16384, 512), ("bf16", 2, 64, 32768, 512),
                                  ("f32", 4, 8, 32768, 2048), ("f32", 4, 8, 65536, 512), ("f32", 4, 16, 65536, 2048),
                                  ("bf16", 4, 8, 65536, 2048), ("f32", 4, 24, 32768, 512))
    for twin in ("", "_full_sm")
)
# TOPK_ROOTS_CASES=rows8: 8 rows of 32K-64K (the indexer's 8 x 64K) on the 8-CTA kernel beside the 4-CTA one and its
# one-CTA-an-SM twin (four tiles a CTA: raw bins, the table and the refined floor instead of two tiles in registers).
ROWS8_CASES = tuple(
    (f"decode_topk_{d}_token_{kernel}", 8, length, k)
    for d, length, k in (("f32", 65536, 512), ("f32", 65536, 2048), ("bf16", 65536, 512), ("f32", 32768, 512))
    for kernel in ("c8", "c4_full_sm", "c4")
)
# TOPK_ROOTS_CASES=twin64: the benchmark's 64 x 256K FP32 cells on the 2-CTA twin (its copy-bandwidth target), and
# 64 x 64K.
TWIN64_CASES = tuple(("decode_topk_f32_token_c2_full_sm", 64, length, k)
                     for length in (262144, 65536) for k in (512, 2048))
CASE_SETS = {"long": LONG_CASES, "twin64": TWIN64_CASES, "rows8": ROWS8_CASES, "routed": ROUTED_CASES, "c2": C2_CASES,
             "twin": TWIN_CASES, "twinmin": TWINMIN_CASES, "wave16": WAVE16_CASES, "row": ROW_CASES,
             "row_only": ROW_ONLY_CASES, "short": SHORT_CASES, "mid": MID_CASES, "share": SHARE_CASES,
             "occupancy": OCCUPANCY_CASES, "small": SMALL_CASES, "bf16": BF16_CASES,
             "wide": WIDE_CASES,
             "c12": C12_CASES, "c9": C9_CASES, "table_gate": TABLE_GATE_CASES, "c8to11": C8TO11_CASES}


def row_ends(rows: int, length: int, g: torch.Generator) -> torch.Tensor:
    """Each row's end: TOPK_ROOTS_ENDS=full (the default: the whole length), short (an eighth of it: a wide logits
    buffer of short rows) or random (uniform in [0, length])."""
    mode = os.environ.get("TOPK_ROOTS_ENDS", "full")
    if mode == "random":
        return torch.randint(0, length + 1, (rows,), dtype=torch.int32, device="cuda", generator=g)
    if mode not in ("full", "short"):
        raise SystemExit(f"TOPK_ROOTS_ENDS={mode!r}: expected full, short or random")
    return torch.full((rows,), length if mode == "full" else length // 8, dtype=torch.int32, device="cuda")


def main() -> None:
    out_path, roots = sys.argv[1], sys.argv[2:]
    cases = CASE_SETS.get(os.environ.get("TOPK_ROOTS_CASES", ""), CASES)
    caches = {r: load(None if r == "." else r) for r in roots}
    results = []
    for name, rows, length, k in cases:
        dtype = torch.bfloat16 if "_bf16_" in name else torch.float32
        nbytes = rows * length * dtype.itemsize
        sets = common.rotation_count(nbytes, most=16)
        g = torch.Generator(device="cuda").manual_seed(rows * 31 + length)
        xs = [torch.randn(rows, length, device="cuda", generator=g).to(dtype) for _ in range(sets)]
        ends = row_ends(rows, length, g)
        out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
        cell = {"kernel": name, "rows": rows, "length": length, "k": k, "us": {}}
        for r, cache in caches.items():
            try:
                kernel = cache.kernel(name)
            except Exception:  # a partial root (e.g. FP32-only phase-stop builds)
                continue
            c = kernel.entry.cluster[0]
            cell.setdefault("max_active_clusters", kernel.max_active_clusters)
            calls = [lambda x=x, kernel=kernel, c=c: kernel.launch(rows * c, x.data_ptr(), ends.data_ptr(),
                                                                 out.data_ptr(), length, x.stride(0), out.stride(0), k)
                     for x in xs]
            cell["us"][r] = round(common.time_graph(calls)["median_us"], 2)
        print(name, rows, length, k, cell["us"], flush=True)
        results.append(cell)
        del xs
    with open(out_path, "w") as f:
        json.dump({"info": common.gpu_info(), "roots": roots, "ends": os.environ.get("TOPK_ROOTS_ENDS", "full"),
                   "cases": results}, f, indent=1)


if __name__ == "__main__":
    main()
