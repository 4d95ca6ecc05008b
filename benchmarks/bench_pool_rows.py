"""What ``runtime.indexer.topk_pool_rows`` costs a layer: its AOT kernel beside the torch chain it replaced, the
floor, and the op it feeds.

For rows in {1, 12, 64} (decode tokens) and widths {512, 2048} (k), over a block table of 4096 pages of 64 (256K
positions), each row's positions a random subset of its request with a -1 tail, in one run:

- ``kernel_us`` / ``kernel_stream_order_us``: GPU time a call of ``topk_pool_rows`` (the cache's kernel, one launch,
  ``out`` given) by CUDA-graph replay (benchmarks.common.time_graph), as launched (PDL) and with ``pdl=False``;
  ``torch_chain_us``: the same map by the exact torch fallback (``_pool_rows_torch``, thirteen kernels, and the
  copy into ``out``), the path every GPU took before the kernel; each over 64 input sets in turn (past the L2 at
  64 rows only: at 1 and 12 rows they stay in it, as a layer's freshly written positions and its table would);
- ``floor``: an empty kernel of the same grid (in stream order: ``stream_order_over_floor`` is the like-for-like
  ratio) plus the bytes a call moves at most (its positions read, a page id gathered and a row written: 12 bytes a
  column) over the measured copy bandwidth (DESIGN.md, "Measuring speed");
- ``host_us``: host time of an eager call (benchmarks.bench_host.host_us: blocks of calls inside the launch queue).

And the layer's pair at T = 12, width 640, sinks on: ``sparse_mla_decode`` alone, and after the map of its 512
compressed columns written straight into its ``indices[:, 128:]`` (both PDL launches, one graph).

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
    floor,
    gpu_info,
    rotation_count,
    source_digest,
    time_graph,
    write_json,
)
from runtime.contract import topk_pool_rows as contract
from runtime.indexer import _pool_rows_kernel, _pool_rows_torch, topk_pool_rows
from runtime.sparse_mla import sparse_mla_decode

PAGES, PAGE = 4096, 64
BYTES_PER_COLUMN = 12  # position read, page id gathered, row written (int32 each)


def mapping_inputs(gen: torch.Generator, rows: int, width: int, pages: int = PAGES, pool_pages: int | None = None):
    """(topk_indices, block_table, out): each row's first ``width - 7`` columns random positions below its
    request's length, the rest -1; the table a shuffle of the pool's pages (``pool_pages``: the pool's page count,
    at least the table's, ids drawn from it)."""
    pool_pages = pool_pages or rows * pages
    table = torch.randperm(pool_pages, device="cuda", generator=gen)[:rows * pages].view(rows, pages).to(torch.int32)
    lens = torch.randint(width, pages * PAGE, (rows,), device="cuda", generator=gen)
    topk = (torch.rand(rows, width, device="cuda", generator=gen) * lens[:, None]).to(torch.int32)
    topk[:, width - 7:] = -1
    return topk, table, torch.empty_like(topk)


def cell(gen: torch.Generator, rows: int, width: int) -> dict:
    """One (rows, width): the kernel as launched (PDL: back to back, each launch's start overlaps the previous
    kernel, which releases it at once: kinder than decode_topk before it in a layer) and in stream order (like the
    floor's empty kernel and the torch chain: the like-for-like ratios), the torch chain, over input sets taken in
    turn (benchmarks.common.rotation_count's 64 at most: past the L2 at 64 rows only; at 1 and 12 rows the floor
    counts from memory bytes the kernel may read from the L2, at most 0.1 µs of the floor there)."""
    bytes_per_set = rows * width * 4 * 2 + rows * PAGES * 4
    sets = [mapping_inputs(gen, rows, width) for _ in range(rotation_count(bytes_per_set))]
    kernel = [lambda t=t, b=b, o=o: topk_pool_rows(t, b, out=o) for t, b, o in sets]
    ordered = [lambda t=t, b=b, o=o: topk_pool_rows(t, b, out=o, pdl=False) for t, b, o in sets]
    chain = [lambda t=t, b=b, o=o: o.copy_(_pool_rows_torch(t, b, PAGE)) for t, b, o in sets]
    for call in kernel:
        call()
    torch.cuda.synchronize()
    equal = all(bool(torch.equal(o, _pool_rows_torch(t, b, PAGE).to(torch.int32))) for t, b, o in sets)
    blocks = -(-width // contract.THREADS)
    result = {"rows": rows, "width": width, "input_sets": len(sets), "kernel_equals_torch_chain": equal,
              "kernel_us": time_graph(kernel, launches=max(50, len(sets)))["median_us"],
              "kernel_stream_order_us": time_graph(ordered, launches=max(50, len(sets)))["median_us"],
              "torch_chain_us": time_graph(chain, launches=max(50, len(sets)))["median_us"],
              "floor": floor(rows * blocks, 1, rows * width * BYTES_PER_COLUMN),
              "host_us": host_us(kernel[0], 100, 21)["median_us"]}
    result["stream_order_over_floor"] = result["kernel_stream_order_us"] / result["floor"]["floor_us"]
    result["as_launched_over_floor"] = result["kernel_us"] / result["floor"]["floor_us"]
    result["torch_chain_over_kernel"] = result["torch_chain_us"] / result["kernel_stream_order_us"]
    result["torch_chain_over_kernel_as_launched"] = result["torch_chain_us"] / result["kernel_us"]
    return result


def layer_pair(gen: torch.Generator) -> dict:
    """sparse_mla_decode at T = 12, width 640 alone and after the map into its indices' compressed columns."""
    T, width = 12, 640
    q, swa, comp, indices, lens, out, kw = sparse_mla_inputs(gen, T, width)
    topk, table, _ = mapping_inputs(gen, T, 512, pages=64, pool_pages=comp.shape[0] // PAGE)
    compressed = indices[:, 128:]
    mla = lambda: sparse_mla_decode(q, swa, comp, indices, lens, out=out, **kw)

    def pair() -> None:
        topk_pool_rows(topk, table, out=compressed)
        mla()

    pair()
    torch.cuda.synchronize()
    mapped = bool(torch.equal(compressed, _pool_rows_torch(topk, table, PAGE).to(torch.int32)))
    alone = time_graph([mla])["median_us"]
    both = time_graph([pair])["median_us"]
    return {"T": T, "width": width, "map_written_into_indices": mapped, "sparse_mla_decode_us": alone,
            "map_then_sparse_mla_decode_us": both, "map_adds_us": both - alone}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_pool_rows.json"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    probe = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    if _pool_rows_kernel(probe, None, 1) is None:
        print("the cache has no topk_pool_rows kernel for this GPU: nothing to measure", file=sys.stderr)
        return 1
    cells = []
    for rows in (1, 12, 64):
        for width in (512, 2048):
            cells.append(cell(gen, rows, width))
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in cells[-1].items() if k != "floor"},
                  flush=True)
    pair = layer_pair(gen)
    print(pair)
    record = {"gpu": gpu_info(), "host_code_digest": source_digest(), "pages": PAGES, "page_size": PAGE,
              "cells": cells, "layer_pair": pair,
              "every_cell_equal": all(c["kernel_equals_torch_chain"] for c in cells)
              and pair["map_written_into_indices"]}
    write_json(args.out, record)
    return 0 if record["every_cell_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
