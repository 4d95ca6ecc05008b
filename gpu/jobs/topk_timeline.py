"""Per-phase SM clocks of decode_topk from a timeline build (DECODE_TOPK_EXPERIMENT=timeline).

usage: topk_timeline.py ROOT OUT.json

ROOT holds the timeline build (cubins/ + manifests/). Each case runs a few times on fresh
logits (the build writes its marks over the row's first bytes); thread 0 of every CTA
reports the clock at each phase's end (kernels/decode_topk/kernel.py, DecodeTopK.mark), and the
global timer at its start and end. Printed per case: each phase's cycles (mean, min, max
over CTAs and runs) and the CTA and grid spans in ns.
"""
import json
import os
import sys

import torch

from benchmarks import common
from runtime.loader import load

# The timeline builds' manifests record their measurement switch, which the runtime refuses unless asked.
os.environ.setdefault("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD", "1")

PHASES = ("setup", "step 1", "cluster wait", "first digit", "pushes", "writes+barrier", "finish (CTA 0)", "to end")
CASES = (  # kernel, rows, length, k
    ("decode_topk_f32_token_c4", 1, 16384, 2048),
    ("decode_topk_f32_token_c16", 1, 65536, 2048),
    ("decode_topk_f32_token_c16", 1, 262144, 2048),
    ("decode_topk_f32_token_c16", 1, 1 << 20, 2048),
    ("decode_topk_f32_token_c8", 8, 262144, 2048),
    ("decode_topk_f32_token_c2", 64, 8192, 512),
    ("decode_topk_f32_token_c2", 64, 262144, 2048),
    ("decode_topk_bf16_token_c16", 1, 262144, 2048),
    ("decode_topk_bf16_token_c8", 8, 65536, 512),
)
# TOPK_TIMELINE_CASES=row: the short-row kernel (one CTA a row; its marks use the same slots).
ROW_CASES = tuple((f"decode_topk_{d}_token_row", rows, length, k)
                  for d, rows, length, k in (("f32", 1, 2048, 512), ("f32", 1, 8192, 512), ("f32", 8, 8192, 512),
                                             ("f32", 64, 8192, 512), ("f32", 1, 16384, 512), ("f32", 1, 16384, 2048),
                                             ("f32", 132, 16384, 512), ("bf16", 1, 8192, 512)))
# TOPK_TIMELINE_CASES=long: long rows on 8 and 16 CTAs (step 1's CTA tiles and table, the marked gather).
LONG_CASES = tuple((f"decode_topk_{d}_token_c{c}", rows, length, k)
                   for d, c, rows, length, k in (("f32", 16, 1, 1 << 20, 512), ("f32", 16, 1, 1 << 20, 2048),
                                                 ("f32", 16, 1, 262144, 2048), ("f32", 8, 8, 1 << 20, 512),
                                                 ("f32", 8, 8, 262144, 2048), ("bf16", 16, 1, 1 << 20, 2048),
                                                 ("bf16", 16, 1, 262144, 512), ("bf16", 8, 8, 262144, 2048),
                                                 ("bf16", 16, 1, 262144, 2048), ("bf16", 8, 14, 262144, 2048)))
# TOPK_TIMELINE_CASES=twin: the 2-CTA one-CTA-an-SM twin on 64 rows of 256K (64 MiB FP32: past the table's L2 limit in
# the committed build), and 8 x 1M FP32 k2048 on 8 CTAs.
TWIN_CASES = (("decode_topk_f32_token_c2_full_sm", 64, 262144, 512),
              ("decode_topk_f32_token_c2_full_sm", 64, 262144, 2048),
              ("decode_topk_bf16_token_c2_full_sm", 64, 262144, 2048), ("decode_topk_f32_token_c8", 8, 1 << 20, 2048))
# TOPK_TIMELINE_CASES=eight: 8 rows of 1M on 8 CTAs (the last BF16 cell under 5x torch.topk), beside 14 rows.
EIGHT_CASES = (("decode_topk_bf16_token_c8", 8, 1 << 20, 2048), ("decode_topk_bf16_token_c8", 8, 1 << 20, 512),
               ("decode_topk_f32_token_c8", 8, 1 << 20, 2048), ("decode_topk_bf16_token_c8", 14, 1 << 20, 2048))
if os.environ.get("TOPK_TIMELINE_CASES") == "eight":
    CASES = EIGHT_CASES
if os.environ.get("TOPK_TIMELINE_CASES") == "long":
    CASES = LONG_CASES
if os.environ.get("TOPK_TIMELINE_CASES") == "twin":
    CASES = TWIN_CASES
if os.environ.get("TOPK_TIMELINE_CASES") == "row":
    CASES = ROW_CASES
RUNS = 5
# TOPK_TIMELINE_COLD=1: each run's logits leave L2 first (a 256 MiB write after their copy), as in the benchmark's
# rotation.
COLD = os.environ.get("TOPK_TIMELINE_COLD") == "1"
# TOPK_TIMELINE_INPUT=indexer: the indexer benchmark's shapes (k = 512) on its DeepGEMM logits, each beside
# the same shape on random logits ("random" in the case's input field).
INDEXER_SIZES = ((64, 8192), (8, 8192), (1, 8192), (8, 65536))


# TOPK_TIMELINE_MARKS=step1: builds with DECODE_TOPK_EXPERIMENT=timeline_step1, whose marks 13 and 14 split step 1's
# first CTA tile (its loads landed, its histogram atomics issued) instead of CTA 0's finish rounds.
STEP1_MARKS = os.environ.get("TOPK_TIMELINE_MARKS") == "step1"
# TOPK_TIMELINE_MARKS=gather: builds with DECODE_TOPK_EXPERIMENT=timeline_gather, whose marks 13, 14 and 15 split the
# marked gather (gather_marked) of a CTA-tile slice: its table read, its compaction, then its rounds.
GATHER_MARKS = os.environ.get("TOPK_TIMELINE_MARKS") == "gather"
# TOPK_TIMELINE_MARKS=refine: builds with DECODE_TOPK_EXPERIMENT=timeline_refine, whose marks 13 and 14 split the
# gathered finish's refined_floor: its table pass, then its cluster barrier and sums.
REFINE_MARKS = os.environ.get("TOPK_TIMELINE_MARKS") == "refine"
# TOPK_TIMELINE_MARKS=finish: builds with DECODE_TOPK_EXPERIMENT=timeline_finish, whose marks 13, 14 and 15 split the
# gathered finish's first round on CTA 0: its histogram pass (to a CTA barrier), its select, its tie ranking.
FINISH_MARKS = os.environ.get("TOPK_TIMELINE_MARKS") == "finish"


def phases(marks):
    """Cycles of each phase from one CTA's marks (slots 0-15 but 10, 11); the cluster-wide finish (mark 8) has
    no 5-7, only CTA 0 has 13-15 (with STEP1_MARKS: every CTA-tile CTA 13 and 14)."""
    m = [int(x) & 0xFFFFFFFF for x in marks]
    d = lambda a, b: (m[b] - m[a]) & 0xFFFFFFFF
    out = {"setup": d(0, 1), "step 1": d(1, 2), "cluster wait": d(2, 3) if m[3] else 0,
           "first digit": d(3 if m[3] else 2, 4)}
    if STEP1_MARKS and m[14]:
        out.update({"step 1: to loads landed": d(1, 13), "step 1: histogram atomics": d(13, 14),
                    "step 1: rest": d(14, 2)})
        m[13] = m[14] = 0
    if REFINE_MARKS and m[14]:
        out.update({"refine: table pass": d(12, 13), "refine: barrier + sums": d(13, 14),
                    "refine: to pass end": d(14, 5)})
        m[13] = m[14] = 0
    if GATHER_MARKS and m[14]:
        # (mark 15: the pass's end, before a refined CTA's staged copy to CTA 0)
        end = 15 if m[15] else 5
        out.update({"gather: table read": d(12, 13), "gather: compaction": d(13, 14), "gather: rounds": d(14, end)})
        if m[15]:
            out["gather: staged copy"] = d(15, 5)
        m[13] = m[14] = m[15] = 0
    if m[5]:
        if m[12]:  # a listed CTA: the pushes pass, then its warps' output-slot reservation (a CTA without a
            # list, a short slice: its slot reservation (4 -> 12), then its pass (12 -> 5), under the same names)
            out.update({"pushes pass": d(4, 12), "slot reservation": d(12, 5)})
        out.update({"pushes": d(4, 5), "writes+barrier": d(5, 6), "finish (CTA 0)": d(6, 7), "to end": d(7, 9)})
        if FINISH_MARKS and m[15]:
            out.update({"finish: histogram": d(6, 13), "finish: select": d(13, 14), "finish: ties": d(14, 15),
                        "finish: rest": d(15, 7)})
        elif m[15]:  # CTA 0's finish: its first two radix rounds, any later ones, the selection pass
            out.update({"finish round 1": d(6, 13), "finish round 2": d(13, 14) if m[14] else 0,
                        "finish later rounds": d(14 if m[14] else 13, 15), "finish selection pass": d(15, 7)})
    else:
        out.update({"clustered finish": d(8, 9)})
    return out


def random_inputs():
    """(kernel, k, logits, row_ends, input) of the random-logit cases."""
    for name, rows, length, k in CASES:
        dtype = torch.bfloat16 if "_bf16_" in name else torch.float32
        g = torch.Generator(device="cuda").manual_seed(rows * 31 + length)
        yield (name, k, torch.randn(rows, length, device="cuda", generator=g).to(dtype),
               torch.full((rows,), length, dtype=torch.int32, device="cuda"), "random")


def indexer_inputs():
    """(kernel, k, logits, row_ends, input) of the indexer benchmark's shapes: its DeepGEMM logits, the same with
    signed head weights, then random."""
    from gpu.jobs.indexer_roots import indexer_logits
    from runtime.scoring import DeepGemmScorer
    from runtime.topk import decode_topk_plan
    from benchmarks.bench_indexer import K

    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows, ctx in INDEXER_SIZES:
        logits, seq_lens = indexer_logits(scorer, rows, ctx, 1, gen)[0]
        name = decode_topk_plan(logits, rows, K, False)[0]
        yield name, K, logits, seq_lens, "deepgemm"
        yield name, K, indexer_logits(scorer, rows, ctx, 1, gen, signed=True)[0][0], seq_lens, "deepgemm_signed"
        yield name, K, torch.randn(logits.shape, device="cuda", generator=gen), seq_lens, "random"


def main() -> None:
    root, out_path = sys.argv[1], sys.argv[2]
    cache = load(root)
    results = []
    inputs = indexer_inputs() if os.environ.get("TOPK_TIMELINE_INPUT") == "indexer" else random_inputs()
    for name, k, base, ends, source in inputs:
        kernel = cache.kernel(name)
        c = kernel.entry.cluster[0]
        rows, length = base.shape
        out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
        per = {}
        by_rank = {}  # (phase, rank) -> cycles: which CTA of a cluster a phase waits on
        spans, grid = [], []
        flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda") if COLD else None
        for run in range(RUNS + 1):
            x = base.clone()
            if COLD:
                flush.fill_(run)
            torch.cuda.synchronize()
            kernel.launch(rows * c, x.data_ptr(), ends.data_ptr(), out.data_ptr(), length, x.stride(0), out.stride(0),
                          k)
            torch.cuda.synchronize()
            if run == 0:
                continue  # the first launch loads the module
            words = x.view(torch.int32)[:, :16 * c].reshape(rows, c, 16).cpu()
            starts, ends_ns = [], []
            for r in range(rows):
                for rank in range(c):
                    w = words[r, rank].tolist()
                    for key, v in phases(w[:10] + [0, 0] + w[12:16]).items():
                        per.setdefault(key, []).append(v)
                        by_rank.setdefault((key, rank), []).append(v)
                    starts.append(w[11] & 0xFFFFFFFF)
                    ends_ns.append(w[10] & 0xFFFFFFFF)
                    spans.append((w[10] - w[11]) & 0xFFFFFFFF)
            grid.append((max(ends_ns) - min(starts)) & 0xFFFFFFFF)
        cell = {"kernel": name, "rows": rows, "length": length, "k": k, "input": source,
                "clustered_finish_ctas": len(per.get("clustered finish", [])), "ctas": len(spans),
                "cta_span_ns_mean": sum(spans) / len(spans), "grid_span_ns_median": sorted(grid)[len(grid) // 2],
                "phases_cycles": {key: {"mean": round(sum(v) / len(v)), "min": min(v), "max": max(v)}
                                  for key, v in per.items()},
                "phases_mean_by_rank": {key: [round(sum(v) / len(v)) if (v := by_rank.get((key, r))) else None
                                              for r in range(c)] for key in per}}
        results.append(cell)
        print(f"{name} rows={rows} length={length} k={k} {source}: CTA span {cell['cta_span_ns_mean']:.0f} ns, "
              f"grid span {cell['grid_span_ns_median']} ns", flush=True)
        for key, v in cell["phases_cycles"].items():
            ranks = " ".join("-" if x is None else str(x) for x in cell["phases_mean_by_rank"][key]) if c > 1 else ""
            print(f"    {key:18s} mean {v['mean']:7d}  min {v['min']:7d}  max {v['max']:7d}  by rank: {ranks}",
                  flush=True)
    with open(out_path, "w") as f:
        json.dump({"info": common.gpu_info(), "root": root, "phases": PHASES, "cases": results}, f, indent=1)


if __name__ == "__main__":
    main()
