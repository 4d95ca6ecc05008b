"""Host time of one eager call of each host op, beside the bare launch of the kernel it makes.

A serving step that is not replayed from a CUDA graph (a batch outside the captured sizes, a debugging run)
pays each op's Python side once a layer: its argument checks, the kernel choice and the launch. This times
that side alone, on the H200's host, for the benchmark's main shapes:

- ``sparse_mla_decode``: T = 12, width 640, sinks on, ``out`` given (and ``out=None``, which allocates);
- ``decode_topk``: 8 x 64K FP32 and 1 x 8K FP32, k 512 (the indexer's k), ``out`` given;
- ``decode_rows``: one single-rank indexer step at 8 x 64K (plan, DeepGEMM's logits, selection), where
  DeepGEMM imports; ``deepgemm_logits``: the scorer's own call, for the step's share that is DeepGEMM's;
- ``launch``: the op's kernel through ``Kernel.launch`` with its arguments prebuilt, the floor of any op
  on the runtime (``bench_runtime.py`` holds that against a bare ``cuLaunchKernelEx``).

Method: blocks of ``--block`` calls (default 100, well inside the launch queue, so no call waits for the GPU),
each block timed on the host clock from its first call's start to its last call's return, then a device
synchronize outside the clock; the median over ``--blocks`` blocks (default 41), in microseconds a call.
``check_us`` = op - launch: what the op adds to its launch.
``--profile``: also a cProfile of each op's calls (the top entries by own time, printed and saved beside the JSON
as ``<out>.profile.txt``).
Usage: ``python3 benchmarks/bench_host.py [--out FILE.json] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import gpu_info, write_json  # noqa: E402
from runtime import load, topk  # noqa: E402
from runtime.contract import sparse_mla_decode as contract  # noqa: E402
from runtime.sparse_mla import sparse_mla_decode  # noqa: E402

FP8 = torch.float8_e4m3fn


def block_us(call, block: int) -> float:
    """Host microseconds a call over one block of ``block`` calls of ``call``; the device synchronize after the block
    is outside the clock (a block stays inside the launch queue, so no call waits for the GPU)."""
    t0 = time.perf_counter()
    for _ in range(block):
        call()
    elapsed = (time.perf_counter() - t0) / block * 1e6
    torch.cuda.synchronize()
    return elapsed


def host_us(call, block: int, blocks: int) -> dict:
    """Median host microseconds a call of ``call`` over ``blocks`` blocks of ``block`` calls."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    per_call = [block_us(call, block) for _ in range(blocks)]
    return {"median_us": statistics.median(per_call), "min_us": min(per_call), "block": block, "blocks": blocks}


def profile(call, calls: int = 2000, top: int = 25) -> str:
    """The top ``top`` functions by own time over ``calls`` calls of ``call``."""
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        call()
        if i % 100 == 99:
            torch.cuda.synchronize()  # the launch queue never fills
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def sparse_mla_inputs(gen, T: int = 12, width: int = 640):
    """(q, swa_kv, compressed_kv, indices, lens, out, keywords) of one sparse_mla_decode call, sinks on."""
    q = torch.randn(T, 16, 512, device="cuda", generator=gen).to(FP8)
    swa = torch.randn(4096, 512, device="cuda", generator=gen).to(FP8)
    comp = torch.randn(65536, 512, device="cuda", generator=gen).to(FP8)
    indices = torch.randint(0, 4096, (T, width), device="cuda", generator=gen, dtype=torch.int32)
    lens = torch.full((T,), width, dtype=torch.int32, device="cuda")
    sinks = torch.randn(16, device="cuda", generator=gen)
    out = torch.empty(T, 16, 512, dtype=torch.bfloat16, device="cuda")
    return q, swa, comp, indices, lens, out, {"sinks": sinks, "bmm1_scale": 0.04, "bmm2_scale": 1.0}


def sparse_mla_cases(gen) -> dict:
    T, width = 12, 640
    q, swa, comp, indices, lens, out, kw = sparse_mla_inputs(gen, T, width)
    kernel = sparse_mla_kernel(width)
    args = (out.data_ptr(), q.data_ptr(), swa.data_ptr(), comp.data_ptr(), indices.data_ptr(), lens.data_ptr(),
            kw["sinks"].data_ptr(), swa.shape[0], comp.shape[0], kw["bmm1_scale"], kw["bmm2_scale"])
    grid = T * width // 128
    return {
        "sparse_mla_decode_T12_w640_out": lambda: sparse_mla_decode(q, swa, comp, indices, lens, out=out, **kw),
        "sparse_mla_decode_T12_w640_no_out": lambda: sparse_mla_decode(q, swa, comp, indices, lens, **kw),
        "launch_sparse_mla_T12_w640": lambda: kernel.launch(grid, *args),
    }


def sparse_mla_kernel(width: int):
    return load().kernel(contract.variant_name(width, True))


def topk_cases(gen) -> dict:
    cases = {}
    for rows, width in ((8, 65536), (1, 8192)):
        logits = torch.randn(rows, width, device="cuda", generator=gen)
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        out = torch.empty(rows, 512, dtype=torch.int32, device="cuda")
        name = f"{rows}x{width // 1024}K_k512"
        kernel, _, grid = topk.decode_topk_plan(logits, rows, 512, False)
        launched = load().kernel(kernel)
        args = (logits.data_ptr(), ends.data_ptr(), out.data_ptr(), width, logits.stride(0), out.stride(0), 512)
        cases[f"decode_topk_{name}"] = lambda logits=logits, ends=ends, out=out: topk.decode_topk(logits, ends, out)
        cases[f"launch_decode_topk_{name}"] = lambda launched=launched, grid=grid, args=args: launched.launch(
            grid, *args)
    return cases


def indexer_cases(gen) -> dict:
    from runtime.scoring import DeepGemmScorer, deepgemm_status

    usable, why = deepgemm_status(torch.device("cuda"))
    if not usable:  # the step is not timed
        return {"skipped": why}
    scorer = DeepGemmScorer()
    from benchmarks.bench_indexer import step_inputs
    from runtime.indexer import SingleRank, decode_rows

    a = step_inputs(scorer, 8, 65536, gen)[0]
    tp = SingleRank()
    return {
        "decode_rows_8x64K_k512": lambda: decode_rows(a.auto, a.md, a.q, a.weights, tp),
        "deepgemm_logits_8x64K": lambda: scorer.logits(a.q, a.weights, a.auto.index_k_cache, a.md.seq_lens,
                                                        a.md.block_table, a.schedule, a.auto.max_model_len),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/host.json")
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=41)
    parser.add_argument("--profile", action="store_true", help="cProfile each op (not the launches)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = {**sparse_mla_cases(gen), **topk_cases(gen)}
    indexer = indexer_cases(gen)
    result = {"env": gpu_info(), "host_us": {}}
    if "skipped" in indexer:
        result["indexer_skipped"] = indexer.pop("skipped")
    cases.update(indexer)
    for name, call in cases.items():
        result["host_us"][name] = host_us(call, args.block, args.blocks)
        print(f"{name:40s} {result['host_us'][name]['median_us']:8.2f} us", flush=True)
    times = {n: r["median_us"] for n, r in result["host_us"].items()}
    result["check_us"] = {
        "sparse_mla_decode_T12_w640_out": times["sparse_mla_decode_T12_w640_out"] - times["launch_sparse_mla_T12_w640"],
        **{n: times[n] - times["launch_" + n] for n in times if n.startswith("decode_topk_")},
    }
    print(result["check_us"])
    write_json(args.out, result)
    if args.profile:
        report = "".join(f"==== {name}\n{profile(call)}\n" for name, call in cases.items()
                         if not name.startswith("launch_"))
        Path(args.out + ".profile.txt").write_text(report)
        print(report)


if __name__ == "__main__":
    main()
