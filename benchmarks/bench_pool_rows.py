"""What ``runtime.indexer.topk_pool_rows`` costs a layer: GPU time and host time of one call.

The mapping of the indexer's top-k positions to pool rows is a chain of torch elementwise ops (thirteen
kernels), not one kernel: this measures what that chain costs beside the op it feeds. For rows in {1, 12, 64}
(decode tokens) and widths {512, 2048} (k), over a block table of 4096 pages of 64 (256K positions), each row's
positions a random subset of its request with a -1 tail:

- ``gpu_us``: GPU time a call, by CUDA-graph replay (benchmarks.common.time_graph, ``out`` given);
- ``host_us``: host time of an eager call (benchmarks.bench_host.host_us: blocks of calls inside the launch queue);
- yardsticks in the same run: ``sparse_mla_decode`` at T = 12, width 640, sinks on (the op the rows feed) and an
  empty one-CTA kernel (a launch's floor in a graph).

Usage: ``python3 benchmarks/bench_pool_rows.py [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_host import host_us, sparse_mla_inputs
from benchmarks.common import (
    empty_kernel_us,
    gpu_info,
    source_digest,
    time_graph,
    write_json,
)
from runtime.indexer import topk_pool_rows
from runtime.sparse_mla import sparse_mla_decode

PAGES, PAGE = 4096, 64


def mapping_inputs(gen: torch.Generator, rows: int, width: int) -> tuple:
    """(topk_indices, block_table, out): each row's first ``width - 7`` columns random positions below its
    request's length, the rest -1; the table a shuffle of the pool's pages."""
    table = torch.randperm(rows * PAGES, device="cuda", generator=gen).view(rows, PAGES).to(torch.int32)
    lens = torch.randint(width, PAGES * PAGE, (rows,), device="cuda", generator=gen)
    topk = (torch.rand(rows, width, device="cuda", generator=gen) * lens[:, None]).to(torch.int32)
    topk[:, width - 7:] = -1
    return topk, table, torch.empty_like(topk)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_pool_rows.json"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cells = []
    for rows in (1, 12, 64):
        for width in (512, 2048):
            topk, table, out = mapping_inputs(gen, rows, width)
            call = lambda t=topk, b=table, o=out: topk_pool_rows(t, b, out=o)
            cell = {"rows": rows, "width": width, "gpu_us": time_graph([call], launches=50)["median_us"],
                    "host_us": host_us(call, 100, 21)["median_us"]}
            cells.append(cell)
            print(cell, flush=True)
    q, swa, comp, indices, lens, out, kw = sparse_mla_inputs(gen, 12, 640)
    mla_us = time_graph([lambda: sparse_mla_decode(q, swa, comp, indices, lens, out=out, **kw)])["median_us"]
    record = {"gpu": gpu_info(), "host_code_digest": source_digest(), "pages": PAGES, "page_size": PAGE,
              "cells": cells, "sparse_mla_decode_T12_w640_gpu_us": mla_us, "empty_kernel_us": empty_kernel_us(1)}
    print({k: v for k, v in record.items() if k.endswith("_us")})
    write_json(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
