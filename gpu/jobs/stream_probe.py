"""Probe: how fast can CTAs stream their slice (max-reduce) on the H200, at the decode_topk grids."""
import torch, triton, triton.language as tl, json, sys

@triton.jit
def stream_max(x_ptr, out_ptr, per_cta, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = x_ptr + pid.to(tl.int64) * per_cta
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    for off in range(0, per_cta, BLOCK):
        v = tl.load(base + off + tl.arange(0, BLOCK), cache_modifier=".cg")
        acc = tl.maximum(acc, v)
    tl.store(out_ptr + pid, tl.max(acc, 0))

def bench(ctas, per_cta, warps, block, stages):
    n = ctas * per_cta
    sets = max(2, int(200e6 // (n * 4)) + 1)
    xs = [torch.randn(n, device="cuda") for _ in range(sets)]
    out = torch.empty(ctas, device="cuda")
    for x in xs: stream_max[(ctas,)](x, out, per_cta, BLOCK=block, num_warps=warps, num_stages=stages)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for x in xs: stream_max[(ctas,)](x, out, per_cta, BLOCK=block, num_warps=warps, num_stages=stages)
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); g.replay(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3 / len(xs))
    ts.sort(); us = ts[len(ts) // 2]
    return {"ctas": ctas, "per_cta": per_cta, "warps": warps, "block": block, "stages": stages, "us": round(us, 2),
            "GBps_per_sm": round(per_cta * 4 / us / 1e3, 1), "TBps": round(n * 4 / us / 1e6, 2)}

res = []
for ctas, per_cta in ((16, 65536), (16, 16384), (128, 131072), (64, 131072)):
    for warps, block, stages in ((16, 4096, 1), (16, 4096, 3), (16, 8192, 2), (8, 4096, 3)):
        r = bench(ctas, per_cta, warps, block, stages); res.append(r); print(r, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
