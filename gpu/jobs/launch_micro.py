"""Host time of Kernel.launch alone (the driver's cuLaunchKernelEx replaced by a no-op), one tree per process.

What the argument packing costs in this Python, apart from the driver and the ops' checks: an 11-argument launch
shaped like sparse_mla_decode's (seven pointers, two int32, two floats) and decode_topk's 6-argument one.
Usage: ``python3 gpu/jobs/launch_micro.py TREE`` (a folder holding ``runtime/``); prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import timeit
import types

sys.path.insert(0, sys.argv[1])
from cuda.bindings import driver as drv

from runtime import loader
from runtime.manifest import ParamEntry

SHAPES = {
    "sparse_mla_11": [("void*", 1 << 40)] * 7 + [("int32_t", 1000), ("int32_t", 2000), ("float", 0.04), ("float", 1.0)],
    "decode_topk_6": [("void*", 1 << 40)] * 3 + [("int32_t", 65536), ("int32_t", 512), ("int32_t", 65536)],
}


# The driver's module as Kernel() reads it, with a no-op launch (it runs on a machine without a GPU too)
loader.driver = lambda: types.SimpleNamespace(cuLaunchKernelEx=lambda config, function, address, extra: (0,),
                                              CUresult=drv.CUresult)


def launch_ns(shape) -> float:
    params = tuple(ParamEntry(f"p{i}", ctype, 0, 0) for i, (ctype, _) in enumerate(shape))
    entry = types.SimpleNamespace(name="k", params=params, cluster=(1, 1, 1), pdl=True, threads=128, smem_bytes=0)
    kernel = loader.Kernel(entry, None, 1, drv.CUlaunchConfig(), device=None)
    args = tuple(value for _, value in shape)
    kernel.launch(60, *args, stream=7)
    return min(timeit.repeat(lambda: kernel.launch(60, *args, stream=7), number=50000, repeat=7)) / 50000 * 1e9


print(json.dumps({"tree": sys.argv[1], "python": sys.version.split()[0],
                  **{name: round(launch_ns(shape)) for name, shape in SHAPES.items()}}))
