"""Issue 2 benchmark: cold start of runtime.load() and host overhead of one eager launch.

(a) ``runtime.load()`` in a fresh process once torch and the CUDA context are up.
(b) Host time per eager launch of the empty kernel through ``Kernel.launch`` against
    a bare cuda-python ``cuLaunchKernelEx`` with a prebuilt config, same process.
Writes JSON to the path given (default benchmarks/results/runtime.json).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

COLD_START = r"""
import json, sys, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
if sys.argv[1] == "preimported":
    import cuda.bindings.driver
t1 = time.perf_counter()
import runtime
cache = runtime.load()
t2 = time.perf_counter()
print(json.dumps({"load_ms": (t2 - t1) * 1e3, "cuda_python_import_ms": (t1 - t0) * 1e3,
                  "kernels": len(cache.names())}))
"""


PROFILE = r"""
import cProfile, io, pstats, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import runtime
prof = cProfile.Profile(); prof.enable(); runtime.load(); prof.disable()
s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15); print(s.getvalue())
"""


def cold_start_profile() -> str:
    """Where load() spends its time (cProfile, by own time), to steer the cold-start work."""
    out = subprocess.run([sys.executable, "-c", PROFILE], capture_output=True, text=True, timeout=300)
    return out.stdout[-6000:] + out.stderr[-2000:]


def cold_start(runs: int = 5) -> dict:
    """load() in fresh processes: as a server calls it (importing cuda-python on the way), and
    with cuda-python already imported."""
    import os

    def measure(mode: str, runs: int = runs) -> dict:
        samples = []
        env = dict(os.environ)
        for _ in range(runs):
            out = subprocess.run([sys.executable, "-c", COLD_START, mode], capture_output=True, text=True,
                                 timeout=300, env=env)
            if out.returncode:
                raise RuntimeError(out.stderr)
            samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
        ms = [s["load_ms"] for s in samples]
        return {"load_ms_median": statistics.median(ms), "load_ms_all": ms, "kernels": samples[0]["kernels"],
                "cuda_python_import_ms_median": statistics.median(s["cuda_python_import_ms"] for s in samples)}

    return {"target_ms": 50,
            "load_including_cuda_python_import": measure("fresh"),
            "load_cuda_python_preimported": measure("preimported")}


def host_overhead(n: int = 20000, rounds: int = 7) -> dict:
    import torch

    import runtime

    kernel = runtime.load().kernel("empty_cluster1")
    drv = __import__("cuda.bindings.driver", fromlist=["driver"])
    stream = torch.cuda.current_stream().cuda_stream
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 1, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
    config.sharedMemBytes = 0
    config.hStream = stream
    config.numAttrs = 0
    import ctypes

    arg = ctypes.c_int32(0)
    ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    address = ctypes.addressof(ptrs)
    function = kernel._function
    launch = drv.cuLaunchKernelEx

    def bare():
        for _ in range(n):
            launch(config, function, address, 0)

    def ours():
        for _ in range(n):
            kernel.launch(1, 0)

    def timed(fn):
        fn()  # warm
        torch.cuda.synchronize()
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        return statistics.median(out)

    bare_us, ours_us = timed(bare), timed(ours)
    return {"runtime_launch_us": ours_us, "bare_cuLaunchKernelEx_us": bare_us, "ratio": ours_us / bare_us,
            "launches_per_round": n, "target_us": 10, "target_ratio": 1.5}


def main() -> None:
    from benchmarks.common import gpu_info, write_json

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = args[0] if args else "benchmarks/results/runtime.json"
    result = {"env": gpu_info(), "cold_start": cold_start(), "launch_overhead": host_overhead()}
    if "--profile" in sys.argv:
        print(cold_start_profile())
    print(json.dumps(result, indent=1))
    write_json(path, result)


if __name__ == "__main__":
    main()
