"""How low any selection could bring the indexer step's selection share: the step with a floor selection.

The floor selection is a Triton kernel that does the least a top-k of the step must do: one launch in stream
order behind DeepGEMM's scoring, with the AOT kernel's CTAs a row, reading every logit of each row (a max keeps
the loads) and writing k indices a row. It selects nothing: a selection laid out as the AOT kernel is (its CTAs a
row) cannot be faster. One Triton configuration (8 warps, 2048-column blocks), not swept: a layout of more CTAs a
row could read a short row sooner, and would then pay a cluster's exchange to select. In one process,
for each size, with bench_indexer's inputs (DeepGEMM logits, schedule in the metadata, KV rotated):

- ``step``: plan + logits + decode_topk in stream order (bench_indexer's step);
- ``step_floor``: plan + logits + the floor selection;
- ``floor_select``: the floor selection alone, in stream order;
- ``select``: decode_topk alone, in stream order (bench_indexer's ``select_in_stream_order``).

``floor_share = floor_select / step_floor``: the share the floor selection itself would have, against the issue's
25 %. Usage: ``PYTHONPATH=. python3 gpu/jobs/indexer_select_floor.py --out FILE.json``.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from benchmarks.bench_indexer import K, decode_step, step_inputs, time_calls
from benchmarks.common import gpu_info, write_json
from runtime.indexer import SingleRank, plan_decode_rows
from runtime.scoring import DeepGemmScorer
from runtime.topk import decode_topk, decode_topk_plan

SIZES = ((1, 8192), (8, 8192), (1, 65536), (1, 262144), (8, 65536))


@triton.jit
def _floor_select(logits, stride, out, out_stride, width, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                  K_PART: tl.constexpr):
    """Program (row, part): read columns [part * CHUNK, + CHUNK) of the row, write K_PART indices."""
    row, part = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, CHUNK, BLOCK):
        col = part * CHUNK + start + offs
        inside = (col < width) & (start + offs < CHUNK)  # this part's columns only, where CHUNK is not whole blocks
        x = tl.load(logits + row * stride + col, mask=inside, other=float("-inf"))
        best = tl.maximum(best, x)
    top = tl.max(best, axis=0)
    idx = part * K_PART + tl.arange(0, K_PART)
    tl.store(out + row * out_stride + idx, idx + (top == float("inf")).to(tl.int32))


def floor_select(logits: torch.Tensor, width: int, out: torch.Tensor, ctas_per_row: int) -> None:
    rows = out.shape[0]
    chunk = triton.cdiv(width, ctas_per_row)
    block = min(2048, triton.next_power_of_2(chunk))
    _floor_select[(rows, ctas_per_row)](logits, logits.stride(0), out, out.stride(0), width, CHUNK=chunk,
                                        BLOCK=block, K_PART=K // ctas_per_row, num_warps=8)


def measure(rows: int, ctx: int, scorer: DeepGemmScorer, gen: torch.Generator) -> dict:
    tp = SingleRank()
    steps = [(a.auto, a.md, a.q, a.weights, a.logits, torch.empty(rows, K, dtype=torch.int32, device="cuda"))
             for a in step_inputs(scorer, rows, ctx, gen)]
    sets = len(steps)
    plan = decode_topk_plan(steps[0][4], rows, K, False)
    ctas = plan[1] if plan is not None else 1  # the AOT kernel's CTAs a row (1: the short-row kernel)

    def step(s):
        decode_step(s[0], s[1], s[2], s[3], tp)

    def step_floor(s):
        plan_decode_rows(s[0], s[1], tp)
        logits = scorer.logits(s[2], s[3], s[0].index_k_cache, s[1].seq_lens, s[1].block_table, s[1].schedule, ctx)
        floor_select(logits, ctx, s[0].topk_indices, ctas)

    res = {"rows": rows, "context": ctx, "k": K, "ctas_per_row": ctas, "topk_kernel": plan, "input_sets": sets}
    res["step"] = time_calls([lambda s=s: step(s) for s in steps])
    res["step_floor"] = time_calls([lambda s=s: step_floor(s) for s in steps])
    res["select"] = time_calls([lambda s=s: decode_topk(s[4], s[1].seq_lens, s[5], pdl=False) for s in steps])
    res["floor_select"] = time_calls([lambda s=s: floor_select(s[4], ctx, s[5], ctas) for s in steps])
    m = {key: res[key]["median_us"] for key in ("step", "step_floor", "select", "floor_select")}
    res["select_share"] = m["select"] / m["step"]
    res["floor_share"] = m["floor_select"] / m["step_floor"]
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    scorer = DeepGemmScorer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for rows, ctx in SIZES:
        r = measure(rows, ctx, scorer, gen)
        results.append(r)
        print(f"rows={rows:2d} ctx={ctx:7d} ctas={r['ctas_per_row']:2d} step={r['step']['median_us']:6.2f} "
              f"select={r['select']['median_us']:5.2f} share={r['select_share']:.3f} | floor: "
              f"step={r['step_floor']['median_us']:6.2f} select={r['floor_select']['median_us']:5.2f} "
              f"share={r['floor_share']:.3f}", flush=True)
        write_json(args.out, {"bench": "indexer_select_floor", "target_select_share": 0.25, "info": gpu_info(),
                              "results": results})


if __name__ == "__main__":
    main()
