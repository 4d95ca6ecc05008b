"""Does programmatic dependent launch overlap back-to-back sparse-MLA launches? (twenty-seventh session)

Width 640 with sinks, T in {1, 12, 48}, the benchmark's KV rotation (bench_sparse_mla.PoolSlices and time_op):
the op launched with PDL (its default) and in plain stream order (pdl=False), two rounds in alternating order,
beside the empty kernel of the same grid and cluster shape.

With ``--marks`` the cache must be a timeline build (SPARSE_MLA_EXPERIMENT=timeline, the runtime pointed at it
by SPARSE_DECODE_AOT_CACHE, and SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1, since its manifest records the switch): a graph of back-to-back launches over the rotated pools is replayed both ways, and
its last launch leaves its per-step clocks over the shared query. Its "wait" step (kernel entry to the
grid-dependency wait's return) says whether its CTAs were resident before the previous grid ended.

    PYTHONPATH=. python3 gpu/jobs/mla_pdl.py OUT.json [--marks]
"""
from __future__ import annotations

import json
import sys

import torch

import runtime
from benchmarks import bench_sparse_mla as bench
from benchmarks import common
from gpu.jobs.mla_kernel_smoke import print_marks, read_marks
from runtime.sparse_mla import sparse_mla_decode

WIDTH = 640
TOKENS = (1, 12, 48)


def op(pdl: bool):
    return lambda *a, **kw: sparse_mla_decode(*a, pdl=pdl, **kw)


def timing(swa, comp, sinks, gen) -> dict:
    res = {}
    for T in TOKENS:
        inp = bench.PoolSlices(T, WIDTH, bench.sets_for(T, WIDTH), swa, comp, sinks, gen)
        cell = {"pdl": [], "stream_order": []}
        for rnd in range(2):
            order = ("pdl", "stream_order") if rnd == 0 else ("stream_order", "pdl")
            for name in order:
                cell[name].append(bench.time_op(op(name == "pdl"), inp, inp.sets)["median_us"])
        cell["empty_kernel_us"] = common.empty_kernel_us(T * WIDTH // 128, WIDTH // 128)
        res[f"w{WIDTH}_T{T}"] = cell
        print(f"T={T}: pdl {cell['pdl']} us, stream order {cell['stream_order']} us, "
              f"empty {cell['empty_kernel_us']:.2f} us", flush=True)
        del inp
    return res


def marks(swa, comp, sinks, gen) -> dict:
    res = {}
    for T in TOKENS:
        inp = bench.PoolSlices(T, WIDTH, min(64, bench.sets_for(T, WIDTH)), swa, comp, sinks, gen)
        for name in ("pdl", "stream_order"):
            bench.time_op(op(name == "pdl"), inp, inp.sets)  # its graph's last launch writes the marks over inp.q
            torch.cuda.synchronize()
            res[f"w{WIDTH}_T{T}_{name}"] = print_marks(f"graph {name} w={WIDTH} T={T}", read_marks(inp.q, WIDTH // 128))
        del inp
    return res


def main() -> None:
    out, with_marks = sys.argv[1], "--marks" in sys.argv[2:]
    runtime.load()
    gen = torch.Generator(device="cuda").manual_seed(0)
    swa, comp, sinks = bench.make_pools(gen)
    result = {"info": common.gpu_info(), "width": WIDTH, "tokens": TOKENS}
    result["marks" if with_marks else "timing"] = (marks if with_marks else timing)(swa, comp, sinks, gen)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
