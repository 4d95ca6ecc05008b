"""The startup a JIT-at-serving design pays: CuTe DSL compiling every sm_90a kernel of the cache.

Runs on the CPU build machine (CuTe DSL cross-compiles; the GPU machine has no CuTe DSL), in a
fresh process with CuTe DSL's file cache disabled, compiling the variants one after another as a
serving process would at start-up. Compare with ``runtime.load()`` in benchmarks/results/runtime.json.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time
t0 = time.perf_counter()
import cutlass  # noqa: F401  (import time is part of what a JIT design pays)
t1 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from kernels import compile_variant
from kernels.compile import build_switches, toolchain
from runtime.contract import all_variants
per = {}
for v in all_variants("sm_90a"):
    s = time.perf_counter(); compile_variant(v, "sm_90a"); per[v.name] = time.perf_counter() - s
print(json.dumps({"import_s": t1 - t0, "compile_s": per, "toolchain": toolchain(), "build_switches": build_switches()}))
"""


def provenance() -> dict:
    """What the compiled kernels were: the commit, whether the files differ from it, and the kernel sources' hash
    (the manifests' ``source_hash``, so a record names the same sources as a build of them)."""
    sys.path.insert(0, str(REPO))  # run as a script: the repository's packages
    from benchmarks.common import files_differ_from_head, head_commit
    from build_kernels import source_hash

    return {"commit": head_commit(REPO), "files_differ_from_commit": files_differ_from_head(REPO),
            "kernel_source_hash": source_hash()}


def main() -> None:
    env = dict(os.environ, CUTE_DSL_DISABLE_FILE_CACHING="1")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", WORKER, str(REPO)], capture_output=True, text=True, env=env,
                         timeout=3600)
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(out.stderr)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    total = sum(data["compile_s"].values())
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "kernels": len(data["compile_s"]),
        "cutedsl_import_s": data["import_s"],
        "compile_total_s": total,
        "process_wall_s": wall,
        "compile_s": data["compile_s"],
        "toolchain": data["toolchain"],
        # A CuTe DSL compile setting or a kernel's measurement switch changes what compiles (kernels/compile.py).
        "build_switches": data["build_switches"],
        **provenance(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "compile_s"}, indent=1))
    path = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "benchmarks/results/jit_compile_cpu.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
