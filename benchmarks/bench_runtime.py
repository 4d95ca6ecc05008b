"""Issue 2 benchmark: cold start of runtime.load() and host overhead of one eager launch.

(a) ``runtime.load()`` in a fresh process once torch and the CUDA context are up, in two modes,
    each in ``--runs`` (default 7) fresh processes: ``fresh`` (load() pays the first import of
    cuda.bindings.driver, as a server does) and ``preimported`` (cuda.bindings imported before the
    clock starts). ``load_ms`` is ``import runtime`` + ``runtime.load()``; both parts are also
    reported alone. The runtime's bytecode is compiled first (``compileall``, as ``pip install``
    does), so no run pays for compiling it. Then a few more runs per mode with
    SPARSE_DECODE_AOT_LOAD_PROFILE=1 give load()'s own phase breakdown (median per phase; those
    runs are not in load_ms).
(b) Host time per eager launch of the empty kernel through ``Kernel.launch`` against
    a bare cuda-python ``cuLaunchKernelEx`` with a prebuilt config, same process, the two side by side in
    each round; ``ratio`` is the median of the rounds' ratios.
Writes JSON to the path given (default benchmarks/results/runtime.json).
Options: --runs N (cold-start runs per mode, at least 7), --profile-runs N (default 3),
--cold-only (skip (b)), --profile (cProfile of one load, printed).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

COLD_START = r"""
import json, sys, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
if sys.argv[1] == "preimported":
    import cuda.bindings.driver
t1 = time.perf_counter()
import runtime
t_import = time.perf_counter()
cache = runtime.load()
t2 = time.perf_counter()
print(json.dumps({"load_ms": (t2 - t1) * 1e3, "import_runtime_ms": (t_import - t1) * 1e3,
                  "load_call_ms": (t2 - t_import) * 1e3, "cuda_python_import_ms": (t1 - t0) * 1e3,
                  "kernels": len(cache.names()), "load_profile": cache.load_profile}))
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


def precompile_runtime() -> bool:
    """Compile runtime/'s bytecode once, as an installed package has it (quietly; False on failure)."""
    out = subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "runtime")], capture_output=True,
                         text=True, timeout=120)
    return out.returncode == 0


def _cold_runs(mode: str, runs: int, profile: bool) -> list[dict]:
    env = dict(os.environ)
    env.pop("SPARSE_DECODE_AOT_LOAD_PROFILE", None)
    if profile:
        env["SPARSE_DECODE_AOT_LOAD_PROFILE"] = "1"
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", COLD_START, mode], capture_output=True, text=True,
                             timeout=300, env=env, cwd=REPO)
        if out.returncode:
            raise RuntimeError(out.stderr)
        samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return samples


def _summary(samples: list[dict], key: str) -> dict:
    values = [s[key] for s in samples]
    return {f"{key}_median": statistics.median(values), f"{key}_all": values}


def _phases(samples: list[dict]) -> dict:
    """Median milliseconds per load() phase over the profiled runs (phases summed over kernels)."""
    profiles = [s["load_profile"] for s in samples if s.get("load_profile")]
    if not profiles:
        return {}
    labels = list(dict.fromkeys(k for p in profiles for k in p["phases_ms"]))
    return {
        "runs": len(profiles),
        "total_ms_median": statistics.median(p["total_ms"] for p in profiles),
        "phases_ms_median": {k: statistics.median(p["phases_ms"].get(k, 0.0) for p in profiles) for k in labels},
        "unaccounted_ms_median": statistics.median(p["unaccounted_ms"] for p in profiles),
        "load_ms_all": [s["load_ms"] for s in samples],
    }


def cold_start(runs: int = 7, profile_runs: int = 3, save=None) -> dict:
    """load() in fresh processes: as a server calls it (importing cuda-python on the way), and
    with cuda-python already imported; then the profiled runs for the phase breakdown.
    ``save(result)`` is called after each step with what is measured so far."""
    if runs < 7:
        raise ValueError("use at least 7 cold-start runs per mode")
    save = save or (lambda result: None)
    compiled = precompile_runtime()

    def measure(mode: str) -> dict:
        samples = _cold_runs(mode, runs, profile=False)
        result = _summary(samples, "load_ms")
        result["kernels"] = samples[0]["kernels"]
        for key in ("import_runtime_ms", "load_call_ms", "cuda_python_import_ms"):
            result.update(_summary(samples, key))
        return result

    result = {"target_ms": 50, "runs_per_mode": runs, "bytecode_precompiled": compiled}
    result["load_including_cuda_python_import"] = measure("fresh")
    save(result)
    result["load_cuda_python_preimported"] = measure("preimported")
    save(result)
    if profile_runs:
        result["load_phases"] = {}
        for mode in ("fresh", "preimported"):
            result["load_phases"][mode] = _phases(_cold_runs(mode, profile_runs, profile=True))
            save(result)
    return result


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

    return launch_overhead(alternating_rounds({"bare": bare, "ours": ours}, rounds, n, torch.cuda.synchronize), n)


def launch_overhead(rounds_us: dict, n: int) -> dict:
    """The record of the eager-launch comparison from ``alternating_rounds``' microseconds per launch of each mode:
    ``ratio`` is the median of the rounds' ours/bare ratios."""
    bare_us, ours_us = statistics.median(rounds_us["bare"]), statistics.median(rounds_us["ours"])
    ratios = [o / b for o, b in zip(rounds_us["ours"], rounds_us["bare"])]
    return {"runtime_launch_us": ours_us, "bare_cuLaunchKernelEx_us": bare_us, "ratio": statistics.median(ratios),
            "ratio_of_medians": ours_us / bare_us, "ratio_range": [min(ratios), max(ratios)],
            "rounds_us": rounds_us, "launches_per_round": n, "target_us": 10, "target_ratio": 1.5}


def alternating_rounds(modes: dict, rounds: int, n: int, sync) -> dict:
    """Microseconds per call, of the ``n`` a mode (a function) makes, round by round with the modes side by side
    in each round. Every mode is run once first (warm). All of one mode's rounds before the other's let the host's
    drift between them into the ratio: one H100 host gave 1.78x that way, and 0.91-1.34x in alternating rounds."""
    for fn in modes.values():
        fn()
    sync()
    out = {name: [] for name in modes}
    for _ in range(rounds):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t0) / n * 1e6)
            sync()
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="benchmarks/results/runtime.json")
    parser.add_argument("--runs", type=int, default=7, help="cold-start runs per mode (at least 7)")
    parser.add_argument("--profile-runs", type=int, default=3, help="runs per mode with the phase profile")
    parser.add_argument("--cold-only", action="store_true", help="skip the launch-overhead measurement")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one load()")
    args = parser.parse_args()
    from benchmarks.common import gpu_info, write_json

    result = {"env": gpu_info()}

    def save(cold: dict) -> None:  # what is measured so far survives a job's time limit
        result["cold_start"] = cold
        write_json(args.path, result)

    cold_start(args.runs, args.profile_runs, save)
    if not args.cold_only:
        result["launch_overhead"] = host_overhead()
    if args.profile:
        print(cold_start_profile())
    print(json.dumps(result, indent=1))
    write_json(args.path, result)


if __name__ == "__main__":
    main()
