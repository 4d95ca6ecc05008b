"""Print the decode_topk route words of a diagnostic build (.gl/stop7: per CTA ok, gathered, list
length, bin count, gather base, krem, b0, local k-th bin) for a few long-row cases."""
import torch

from runtime.loader import load

cache = load(".gl/stop7")
for name, rows, length, k in (("decode_topk_f32_token_c16", 1, 65536, 2048), ("decode_topk_f32_token_c16", 1, 262144, 2048),
                              ("decode_topk_f32_token_c8", 8, 1 << 20, 2048), ("decode_topk_f32_token_c2", 64, 262144, 2048),
                              ("decode_topk_f32_token_c2", 64, 16384, 2048)):
    kernel = cache.kernel(name)
    c = kernel.entry.cluster[0]
    x = torch.randn(rows, length, device="cuda")
    ends = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    kernel.launch(rows * c, x.data_ptr(), ends.data_ptr(), out.data_ptr(), length, x.stride(0), out.stride(0), k)
    torch.cuda.synchronize()
    print(name, rows, length, k, "ok gather n_list count0 gather_base krem b0 local_kth")
    print(out[0, : 8 * c].view(c, 8).tolist())
