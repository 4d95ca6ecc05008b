"""Probe: what the kernel and the reference give for a +inf sink and one past FLT_MAX / log2(e)."""
import torch

from runtime.reference import sparse_mla_decode_reference
from runtime.sparse_mla import sparse_mla_decode

g = torch.Generator(device="cuda").manual_seed(0)
T, W = 2, 640
q = torch.randn(T, 16, 512, device="cuda", generator=g).to(torch.float8_e4m3fn)
swa = torch.randn(4096, 512, device="cuda", generator=g).to(torch.float8_e4m3fn)
comp = torch.randn(4096, 512, device="cuda", generator=g).to(torch.float8_e4m3fn)
idx = torch.randint(0, 4096, (T, W), device="cuda", dtype=torch.int32, generator=g)
lens = torch.full((T,), W, device="cuda", dtype=torch.int32)
for v in (float("inf"), 3.0e38, 2.0e38, float("-inf"), 100.0):
    sinks = torch.zeros(16, device="cuda"); sinks[3] = v
    out = sparse_mla_decode(q, swa, comp, idx, lens, sinks=sinks, bmm1_scale=512 ** -0.5, bmm2_scale=1.0, pdl=False)
    ref = sparse_mla_decode_reference(q, swa, comp, idx, lens, sinks=sinks, bmm1_scale=512 ** -0.5, bmm2_scale=1.0)
    o, r = out[:, 3].float(), ref[:, 3].float()
    print(f"sink {v:g}: kernel nan={o.isnan().any().item()} max|.|={o.abs().max().item():.3g}; "
          f"reference nan={r.isnan().any().item()} max|.|={r.abs().max().item():.3g}; other heads equal "
          f"within 0.05: {bool(((out.float() - ref.float()).abs()[:, [h for h in range(16) if h != 3]] < 0.05).all())}")
