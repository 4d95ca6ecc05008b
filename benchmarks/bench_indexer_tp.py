"""Row-sharded indexer over NCCL (issue 6): every rank scores only its slice.

Run with one process per GPU, for any world size:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --standalone --nproc-per-node N benchmarks/bench_indexer_tp.py --out FILE.json

For batch in {16, 18, 64} rows (18 leaves the last slices short or empty at
world 4) each rank builds the same step (same seeds), runs it replicated (world
of one, no collective) and row-sharded (DistGroup over NCCL), checks that the
gathered top-k rows and candidate blocks equal the replicated run on every rank
(as sets per row: the AOT kernel's order within a row is unspecified), and times
both (CUDA events around eager steps; the sharded step includes its gathers).
Rank 0 writes the JSON with the world size.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(var, "0" if var == "NCCL_NVLS_ENABLE" else "1")  # never NVLink multicast

from benchmarks.bench_indexer import HEAD_DIM, HEADS, K, random_cache  # noqa: E402
from benchmarks.common import gpu_info, time_eager, write_json  # noqa: E402
from runtime.indexer import (  # noqa: E402
    DecodeMetadata,
    DistGroup,
    IndexerState,
    SingleRank,
    decode_rows,
    row_shard_bounds,
)
from runtime.scoring import BLOCK_KV, DeepGemmScorer  # noqa: E402

CANDIDATES = 512


def make_inputs(rows: int, ctx: int, seed: int):
    """The same step on every rank: generated from one seed on each rank's GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_row = ctx // BLOCK_KV
    cache = random_cache(rows * pages_per_row, gen)
    table = torch.arange(rows * pages_per_row, dtype=torch.int32, device="cuda").view(rows, pages_per_row)
    lens = ctx - torch.randint(0, BLOCK_KV * 4, (rows,), device="cuda", generator=gen).to(torch.int32)
    md = DecodeMetadata(lens, table, num_requests=rows, num_tokens=rows, max_seq_len=ctx)
    q = torch.randn(rows, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(rows, HEADS, device="cuda", generator=gen) * HEADS**-0.5
    return cache, md, q, w


def new_state(rows_cap: int, cache, ctx: int, scorer) -> IndexerState:
    return IndexerState(torch.full((rows_cap, K), -1, dtype=torch.int32, device="cuda"), K, cache, ctx,
                        candidate_blocks=torch.full((rows_cap, CANDIDATES), -1, dtype=torch.int32, device="cuda"),
                        scorer=scorer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 18, 64])
    parser.add_argument("--out", default="benchmarks/results/indexer_tp.json")
    args = parser.parse_args()

    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    group = DistGroup()
    scorer = DeepGemmScorer()
    results = []
    for rows in args.rows:
        cache, md, q, w = make_inputs(rows, args.context, seed=rows)
        cap = 2 * rows + 8 * group.world_size  # room for world x slice rows
        want = new_state(cap, cache, args.context, scorer)
        got = new_state(cap, cache, args.context, scorer)
        replicated = lambda: decode_rows(want, md, q, w, SingleRank())  # noqa: E731
        sharded = lambda: decode_rows(got, md, q, w, group)  # noqa: E731
        replicated()
        sharded()
        torch.cuda.synchronize()
        equal = bool(torch.equal(got.topk_indices[:rows].sort(dim=1).values, want.topk_indices[:rows].sort(dim=1).values)
                     and torch.equal(got.candidate_blocks[:rows].sort(dim=1).values,
                                     want.candidate_blocks[:rows].sort(dim=1).values))
        flags = [torch.tensor([int(equal)], device="cuda") for _ in range(group.world_size)]
        dist.all_gather(flags, torch.tensor([int(equal)], device="cuda"))
        dist.barrier()
        t_rep = time_eager([replicated])
        dist.barrier()
        t_shard = time_eager([sharded])
        bounds = row_shard_bounds(rows, rows, group.world_size, group.rank)
        results.append({"rows": rows, "context": args.context, "bounds_rank0": row_shard_bounds(rows, rows, group.world_size, 0),
                        "slices": [row_shard_bounds(rows, rows, group.world_size, r) for r in range(group.world_size)],
                        "equal_on_every_rank": all(int(f) for f in flags), "replicated": t_rep, "sharded": t_shard,
                        "speedup": t_rep["median_us"] / t_shard["median_us"], "this_rank_bounds": bounds})
        if group.rank == 0:
            r = results[-1]
            print(f"world={group.world_size} rows={rows} slices={r['slices']} equal={r['equal_on_every_rank']} "
                  f"replicated={t_rep['median_us']:.1f}us sharded={t_shard['median_us']:.1f}us "
                  f"speedup={r['speedup']:.2f}", flush=True)
        del cache, want, got
        torch.cuda.empty_cache()
    if group.rank == 0:
        write_json(args.out, {"bench": "indexer_row_sharded", "world_size": group.world_size, "info": gpu_info(),
                              "results": results})
    ok = all(r["equal_on_every_rank"] for r in results)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
