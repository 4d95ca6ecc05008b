"""Exploratory: would another selection design bring the indexer's short steps under 25 %?

A Triton top-k of one program a row that keeps the whole row in registers and finds the k-th largest key by four
fixed 8-bit radix passes (a histogram of the candidates' digit, a suffix sum, the bin that holds the k-th), then
writes the items above it and the lowest-indexed ties by one prefix sum: no shared-memory list, no second read,
no cluster. Rows of at most ROW columns, full rows (seq_len = width) only: a prototype for measurement, not a
replacement (the runtime never runs Triton). On the indexer's step at 1 x 8K and 8 x 8K (bench_indexer's inputs,
DeepGEMM logits), beside decode_topk, in one process: the selection alone in stream order, the step with each,
and whether both pick the same sets. Usage:
``PYTHONPATH=. python3 gpu/jobs/indexer_triton_select.py --out FILE.json`` (``TRITON_INTERPRET=1 ... --check-cpu``: the
algorithm against the exact sets on the CPU, no GPU).
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

ROW = 8192
BINS = 512  # 256 digit bins, and non-candidates counted apart in bin 256


@triton.jit
def _radix_topk_row(logits, stride, out, out_stride, K: tl.constexpr, N: tl.constexpr, BINS: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    x = tl.load(logits + row * stride + offs)
    bits = x.to(tl.uint32, bitcast=True)
    # Order-preserving unsigned key: negative floats flip every bit, the others set the sign bit.
    key = tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)
    bins = tl.arange(0, BINS)
    prefix = tl.zeros([], dtype=tl.uint32)
    remaining = tl.full([], K, tl.int32)
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        if p == 0:
            digit = (key >> shift).to(tl.int32)
        else:
            cand = (key >> (shift + 8)) == (prefix >> (shift + 8))
            digit = tl.where(cand, ((key >> shift) & 0xFF).to(tl.int32), 256)
        hist = tl.histogram(digit, BINS)
        hist = tl.where(bins < 256, hist, 0)
        suffix = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # candidates with digit >= bin
        chosen = tl.max(tl.where(suffix >= remaining, bins, -1), 0)
        remaining -= tl.sum(tl.where(bins > chosen, hist, 0), 0)
        prefix = prefix | (chosen.to(tl.uint32) << shift)
    above = key > prefix
    tie = key == prefix
    take = above | (tie & (tl.cumsum(tie.to(tl.int32), 0) <= remaining))
    slot = tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(out + row * out_stride + slot, offs, mask=take)


def radix_topk(logits: torch.Tensor, out: torch.Tensor) -> None:
    """Top-k sets of full rows of ``logits`` (``[rows, ROW]`` FP32) into ``out`` ``[rows, k]``."""
    rows, width = logits.shape
    assert width == ROW and logits.stride(1) == 1
    _radix_topk_row[(rows,)](logits, logits.stride(0), out, out.stride(0), K=out.shape[1], N=ROW, BINS=BINS,
                             num_warps=16)


def same_sets(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a.sort(dim=1).values == b.sort(dim=1).values).all())


def check_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    for rows, k, kind in ((2, 512, "randn"), (1, 2048, "randn"), (2, 512, "ties"), (1, 512, "positive")):
        x = torch.randn(rows, ROW, generator=g)
        if kind == "ties":
            x = x.round()
        if kind == "positive":
            x = x.abs() * 0.01 + 1.0
        out = torch.full((rows, k), -7, dtype=torch.int32)
        radix_topk(x, out)
        # The exact sets with ties taken lowest index first: sorted by (-value, index).
        want = torch.stack([torch.tensor(sorted(range(ROW), key=lambda i: (-float(x[r, i]), i))[:k])
                            for r in range(rows)]).to(torch.int32)
        assert same_sets(out, want), (rows, k, kind)
        print(f"cpu check {kind} rows={rows} k={k}: same sets")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--check-cpu", action="store_true")
    args = parser.parse_args()
    if args.check_cpu:
        assert os.environ.get("TRITON_INTERPRET") == "1", "run the CPU check with TRITON_INTERPRET=1"
        check_cpu()
        return
    from benchmarks.bench_indexer import K, step_inputs, time_calls
    from benchmarks.common import gpu_info, write_json
    from runtime.indexer import SingleRank, finish_decode_rows, plan_decode_rows
    from runtime.scoring import DeepGemmScorer
    from runtime.topk import decode_topk

    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    tp = SingleRank()
    results = []
    for rows in (1, 8, 64):
        ctx = ROW
        steps = [(a.auto, a.md, a.q, a.weights, a.logits, torch.empty(rows, K, dtype=torch.int32, device="cuda"))
                 for a in step_inputs(scorer, rows, ctx, gen)]

        def step_aot(s):
            finish_decode_rows(s[0], s[2], s[3], plan_decode_rows(s[0], s[1], tp), tp)

        def step_triton(s):
            plan_decode_rows(s[0], s[1], tp)
            logits = scorer.logits(s[2], s[3], s[0].index_k_cache, s[1].seq_lens, s[1].block_table, s[1].schedule,
                                   ctx)
            radix_topk(logits[:, :ctx], s[0].topk_indices)

        s0 = steps[0]
        mine, theirs = torch.empty_like(s0[5]), torch.empty_like(s0[5])
        radix_topk(s0[4][:, :ctx], mine)
        decode_topk(s0[4], s0[1].seq_lens, theirs, pdl=False)
        r = {"rows": rows, "context": ctx, "k": K, "same_sets_as_decode_topk": same_sets(mine, theirs)}
        r["select_aot"] = time_calls([lambda s=s: decode_topk(s[4], s[1].seq_lens, s[5], pdl=False) for s in steps])
        r["select_triton"] = time_calls([lambda s=s: radix_topk(s[4][:, :ctx], s[5]) for s in steps])
        r["step_aot"] = time_calls([lambda s=s: step_aot(s) for s in steps])
        r["step_triton"] = time_calls([lambda s=s: step_triton(s) for s in steps])
        m = {key: r[key]["median_us"] for key in ("select_aot", "select_triton", "step_aot", "step_triton")}
        r["share_aot"] = m["select_aot"] / m["step_aot"]
        r["share_triton"] = m["select_triton"] / m["step_triton"]
        results.append(r)
        print(f"rows={rows:2d} ctx={ctx} same={r['same_sets_as_decode_topk']} aot: select={m['select_aot']:.2f} "
              f"step={m['step_aot']:.2f} share={r['share_aot']:.3f} | triton radix: select={m['select_triton']:.2f} "
              f"step={m['step_triton']:.2f} share={r['share_triton']:.3f}", flush=True)
        if args.out:
            write_json(args.out, {"bench": "indexer_triton_select", "info": gpu_info(), "results": results})


if __name__ == "__main__":
    main()
