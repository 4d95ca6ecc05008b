"""Whether NCCL takes two ranks on one GPU here (torchrun --nproc-per-node 2; every rank on cuda:0)."""
import os

import torch
import torch.distributed as dist

for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(var, value)
torch.cuda.set_device(0)
dist.init_process_group("nccl")
rank = dist.get_rank()
x = torch.full((2, 3), rank, dtype=torch.int32, device="cuda")
out = torch.empty(4, 3, dtype=torch.int32, device="cuda")
try:
    dist.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    print(f"rank {rank}: gathered {out[:, 0].tolist()}", flush=True)
except Exception as exc:  # the answer is the message
    print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
dist.destroy_process_group()
