"""One decode_topk benchmark cell looked at closer: the op (as launched and in stream order) for several k and input
seeds, and each cached kernel of that shape launched directly, with the exact reference checked before timing.

Written for the fifty-fifth session's H100 run, where FP32 64 x 1M k2048 took 183 us against 111 us at k512
(decode_topk_s40.json on the H200: 104.7 against 95.0): is it the cell's data, k, PDL, or the kernel the op routes
it to?

The recorded run (topk_cell_probe_s55_h100.json) took the defaults; --scales (factors on the normal logits, which
move the first digit's bin edges against the row's largest values) came after it and has not run yet.

    PYTHONPATH=. python3 gpu/jobs/topk_cell_probe.py OUT.json [--rows 64 --length 1048576 --dtype f32]
        [--ks 512,1024,2048] [--seeds S,...] [--scales 0.8,1,1.25]
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks import common
from benchmarks.bench_topk import DTYPES, check_rows, kernels_for_rows, launch_direct


def probe(rows: int, length: int, dtype: str, ks, seeds, scales=(1.0,)) -> list[dict]:
    import runtime
    from runtime.topk import decode_topk, decode_topk_plan

    cache = runtime.load()
    tdtype = DTYPES[dtype]
    nbytes = rows * length * torch.tensor([], dtype=tdtype).element_size()
    sets = common.rotation_count(nbytes, most=8192)
    ends = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    found = []
    for seed, scale in [(seed, scale) for seed in seeds for scale in scales]:
        g = torch.Generator(device="cuda").manual_seed(seed)
        # scale: where the first digit's bin edges fall among the row's largest values (a bin of FP32 keys spans
        # a quarter of an octave), which sets how many items a warp's list segment holds at a given bound.
        logits = [(torch.randn(rows, length, device="cuda", generator=g) * scale).to(tdtype) for _ in range(sets)]
        for k in ks:
            outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in range(sets)]
            plan = decode_topk_plan(logits[0], rows, k, False)
            decode_topk(logits[0], ends, outs[0])
            check_rows(outs[0], logits[0], ends, k, False)

            def median_us(call, logits=logits, outs=outs):
                """Median us of ``call(x, o)`` over the input sets, by CUDA-graph replay."""
                return common.time_graph([lambda x=x, o=o: call(x, o) for x, o in zip(logits, outs)])["median_us"]

            res = {"seed": seed, "scale": scale, "k": k, "routed_to": plan[0], "sets": sets,
                   "op_us": median_us(lambda x, o: decode_topk(x, ends, o)),
                   "op_in_stream_order_us": median_us(lambda x, o: decode_topk(x, ends, o, pdl=False)),
                   "by_kernel_us": {}}
            for name, c, kernel in kernels_for_rows(cache, rows, dtype, twins=True):
                launch_direct(kernel, c, logits[0], ends, outs[0], k)
                check_rows(outs[0], logits[0], ends, k, False)
                res["by_kernel_us"][name] = median_us(
                    lambda x, o, kernel=kernel, c=c, k=k: launch_direct(kernel, c, x, ends, o, k))
            print(json.dumps(res), flush=True)
            found.append(res)
        del logits
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--length", type=int, default=1 << 20)
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    ap.add_argument("--ks", default="512,1024,2048")
    ap.add_argument("--seeds", default="", help="comma-separated; default: the benchmark's seed, then two others")
    ap.add_argument("--scales", default="1", help="comma-separated factors on the standard normal logits")
    a = ap.parse_args()
    bench_seed = a.rows * 31 + a.length  # bench_topk.bench_cell's
    seeds = [int(s) for s in a.seeds.split(",") if s] or [bench_seed, 1, 2]
    cells = probe(a.rows, a.length, a.dtype, [int(k) for k in a.ks.split(",")], seeds,
                  [float(x) for x in a.scales.split(",")])
    common.write_json(a.out, {"info": common.gpu_info(), "rows": a.rows, "length": a.length, "dtype": a.dtype,
                              "copy_gbs": common.copy_bandwidth_gbs(), "cells": cells})


if __name__ == "__main__":
    main()
