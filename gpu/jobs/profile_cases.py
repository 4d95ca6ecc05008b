"""Launch one case a few times, for ncu (helper of gpu/jobs/profile.sh).

usage: profile_cases.py topk NAME ROWS LENGTH K [indexer]     (FP32/BF16 from the kernel name, direct launch;
                                                               indexer: FP32 logits of bench_indexer's inputs
                                                               scored by DeepGEMM, k = 512, instead of random)
       profile_cases.py mla T WIDTH
"""
import sys

import torch

import runtime


def indexer_rows(rows, length):
    """Two sets of the indexer benchmark's DeepGEMM logits (positive head weights), rows x length."""
    from gpu.jobs.indexer_roots import indexer_logits
    from runtime.scoring import DeepGemmScorer

    gen = torch.Generator(device="cuda").manual_seed(0)
    return [x for x, _ in indexer_logits(DeepGemmScorer(), rows, length, 2, gen)]


def topk(name, rows, length, k, source="random"):
    kernel = runtime.load().kernel(name)
    c = kernel.entry.cluster[0]
    dtype = torch.float32 if "_f32_" in name else torch.bfloat16
    # Two inputs in turn: the profiled launch reads logits the previous launch did not (as the benchmark rotates them).
    if source not in ("random", "indexer") or (source == "indexer" and dtype != torch.float32):
        raise ValueError(f"input {source!r}: use 'random', or 'indexer' with an FP32 kernel (its logits are FP32)")
    if source == "indexer":
        xs = indexer_rows(rows, length)
    else:
        xs = [torch.randn(rows, length, device="cuda").to(dtype) for _ in range(2)]
    ends = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    for i in range(4):
        x = xs[i % 2]
        kernel.launch(rows * c, x.data_ptr(), ends.data_ptr(), out.data_ptr(), length, x.stride(0), out.stride(0), k)
    torch.cuda.synchronize()


def mla(T, width):
    from runtime.sparse_mla import sparse_mla_decode
    from tests.test_sparse_mla_gpu import BMM1_SCALE, BMM2_SCALE, make_case

    args, sinks = make_case(T, width, seed=7)
    out = torch.empty((T, 16, 512), dtype=torch.bfloat16, device="cuda")
    for _ in range(4):
        sparse_mla_decode(*args, sinks=sinks, out=out, bmm1_scale=BMM1_SCALE, bmm2_scale=BMM2_SCALE)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "topk":
        topk(sys.argv[2], *map(int, sys.argv[3:6]), *sys.argv[6:7])
    else:
        mla(*map(int, sys.argv[2:4]))
