"""Where runtime.load() spends its time, per driver call, summed over every kernel of the arch.

Runs in a fresh process (torch and the CUDA context up first). Also times a CUkernel-only route
(cuKernelGetParamInfo / cuKernelGetAttribute / occupancy on the CUkernel) that never asks for a
context's CUfunction, to see whether per-context module loading is the cost. The CPU checks are
the loader's (path, size, sha256, ELF header; the parameter count from the kernel's ELF
attributes). load() itself reports its phases with SPARSE_DECODE_AOT_LOAD_PROFILE=1
(benchmarks/bench_runtime.py collects them).
"""

import json
import sys
import time
from collections import defaultdict

import torch

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
import cuda.bindings.driver as drv  # noqa: E402

t_import = time.perf_counter() - t0
from runtime.manifest import check_param_count, read_checked_cubin, read_manifest  # noqa: E402

route = sys.argv[1] if len(sys.argv) > 1 else "function"
cost = defaultdict(float)


def timed(label, fn, *args):
    s = time.perf_counter()
    out = fn(*args)
    cost[label] += time.perf_counter() - s
    return out


start = time.perf_counter()
m = timed("read_manifest", read_manifest, None, "sm_90a")
dev = drv.cuCtxGetDevice()[1]
attr = drv.CUfunction_attribute
for e in m.kernels.values():
    data = timed("cpu_checks", lambda: read_checked_cubin(m, e, sections=False))
    timed("cpu_checks", check_param_count, data, e, e.cubin, m.arch)
    lib = timed("cuLibraryLoadData", drv.cuLibraryLoadData, data, None, None, 0, None, None, 0)[1]
    k = timed("cuLibraryGetKernel", drv.cuLibraryGetKernel, lib, e.symbol.encode())[1]
    if route == "function":
        f = timed("cuKernelGetFunction", drv.cuKernelGetFunction, k)[1]
        for i in range(len(e.params)):
            timed("param_info", drv.cuFuncGetParamInfo, f, i)
        timed("get_attribute", drv.cuFuncGetAttribute, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f)
        target = f
    else:
        for i in range(len(e.params)):
            timed("param_info", drv.cuKernelGetParamInfo, k, i)
        timed("get_attribute", drv.cuKernelGetAttribute, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, k, dev)
        target = drv.CUfunction(int(k))
    timed("set_attribute", drv.cuKernelSetAttribute, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
          e.smem_bytes, k, dev)
    if e.cluster_size > 1:
        c = drv.CUlaunchConfig()
        c.blockDimX, c.blockDimY, c.blockDimZ = e.threads, 1, 1
        c.gridDimX, c.gridDimY, c.gridDimZ = e.cluster
        c.sharedMemBytes = e.smem_bytes
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = e.cluster
        c.attrs, c.numAttrs = [a], 1
        if e.cluster_size > 8:
            timed("set_attribute", drv.cuKernelSetAttribute,
                  attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, k, dev)
        r = timed("occupancy", drv.cuOccupancyMaxActiveClusters, target, c)
    else:
        r = timed("occupancy", drv.cuOccupancyMaxActiveBlocksPerMultiprocessor, target, e.threads, e.smem_bytes)
    cost["occupancy_errors"] += 0 if r[0] == drv.CUresult.CUDA_SUCCESS else 1
total = time.perf_counter() - start
print(json.dumps({"route": route, "kernels": len(m.kernels), "import_ms": t_import * 1e3, "total_ms": total * 1e3,
                  "ms": {k: (v * 1e3 if k != "occupancy_errors" else v) for k, v in cost.items()}}))
