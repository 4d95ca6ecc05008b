"""How fast plain loads stream a slice per CTA on this GPU, at decode_topk's grids (a probe, not a project kernel).

usage: stream_probe.py OUT.json

A Triton max-reduce: each program reads its contiguous slice of FP32 once. Timed as the
benchmarks time kernels (benchmarks/common.py: CUDA-graph replay, inputs rotated past L2),
for 16 CTAs (one row on 16 CTAs) and 64 / 128 CTAs (rows on 1 or 2 CTAs), a few warp counts
and block sizes: what one SM pulls from HBM with simple loads, beside decode_topk's step 1.
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from benchmarks.common import gpu_info, rotation_count, time_graph

GRIDS = ((16, 65536), (16, 16384), (128, 131072), (64, 131072))  # (CTAs, FP32 columns each)
CONFIGS = ((16, 4096, 1), (16, 4096, 3), (16, 8192, 2), (8, 4096, 3))  # (warps, block, stages)
# STREAM_PROBE=warps: the same bytes as one-warp programs, 16 a CTA's slice (each its contiguous
# sixteenth, 256 or 512 columns an iteration): decode_topk's warp loop's access pattern, where an SM
# streams 16 separate regions instead of one.
WARP_CONFIGS = ((1, 256, 1), (1, 512, 1), (1, 256, 3))


@triton.jit
def stream_max(x_ptr, out_ptr, per_cta, BLOCK: tl.constexpr):
    base = x_ptr + tl.program_id(0).to(tl.int64) * per_cta
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    for off in range(0, per_cta, BLOCK):
        acc = tl.maximum(acc, tl.load(base + off + tl.arange(0, BLOCK), cache_modifier=".cg"))
    tl.store(out_ptr + tl.program_id(0), tl.max(acc, 0))


def probe(ctas: int, per_cta: int, warps: int, block: int, stages: int) -> dict:
    n = ctas * per_cta
    xs = [torch.randn(n, device="cuda") for _ in range(rotation_count(n * 4, most=16))]
    out = torch.empty(ctas, device="cuda")
    calls = [lambda x=x: stream_max[(ctas,)](x, out, per_cta, BLOCK=block, num_warps=warps, num_stages=stages)
             for x in xs]
    us = time_graph(calls)["median_us"]
    return {"ctas": ctas, "per_cta": per_cta, "warps": warps, "block": block, "stages": stages, "us": round(us, 2),
            "GBps_per_program": round(per_cta * 4 / us / 1e3, 1), "TBps": round(n * 4 / us / 1e6, 2)}


def main() -> None:
    runs = []
    for ctas, per_cta in GRIDS:
        for warps, block, stages in CONFIGS:
            runs.append(probe(ctas, per_cta, warps, block, stages))
            print(runs[-1], flush=True)
        if os.environ.get("STREAM_PROBE") == "warps":
            for warps, block, stages in WARP_CONFIGS:
                runs.append(probe(16 * ctas, per_cta // 16, warps, block, stages))
                print(runs[-1], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"info": gpu_info(), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
