"""Compiling one CuTe DSL launch function to a cubin for a target arch, no GPU needed."""

from __future__ import annotations

import os
import tempfile

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr

import cuda.bindings.driver as cuda


def gmem_ptr(dtype, align: int):
    """A placeholder global pointer argument for cute.compile (its value is unused). ``align``: the bytes the host
    op guarantees for the pointer's start, no more: the compiler may vectorize accesses on it (the cubin's symbol and
    PTX parameter declare it), so a promise above the host's check is a fault waiting for a code change."""
    return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)


def contract_pointers(contract, dtypes: dict) -> list:
    """Placeholder pointers for a family's void* parameters (``contract.PARAMS``, in order), each of its dtype in
    ``dtypes`` and declared at the alignment the host op guarantees for it (``contract.POINTER_ALIGN``)."""
    names = [p.name for p in contract.PARAMS if p.ctype == "void*"]
    return [gmem_ptr(dtypes[name], contract.POINTER_ALIGN[name]) for name in names]


def null_stream():
    return cuda.CUstream(0)


def cubin_of(launch_fn, *args, arch: str) -> bytes:
    """cute.compile ``launch_fn(*args)`` for ``arch`` and return the kernel's cubin.

    The cubin comes from the compile artifacts (``__cubin__``), which CuTe DSL
    only fills when asked to keep it; its dump files go to a private temp dir.
    """
    with tempfile.TemporaryDirectory(prefix="cute_dump_") as dump:
        options = f"--gpu-arch {arch} --keep-cubin --dump-dir {dump}"
        compiled = cute.compile(launch_fn, *args, options=options)
        cubin = compiled.__cubin__
    if not isinstance(cubin, (bytes, bytearray)) or not cubin:
        raise RuntimeError(f"CuTe DSL produced no cubin for {launch_fn.__name__} on {arch}")
    return bytes(cubin)


def toolchain() -> dict:
    """Versions that determine the cubin bytes, recorded in the manifest."""
    from importlib.metadata import version, PackageNotFoundError

    out = {}
    for pkg in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
                "nvidia-cutlass-dsl-libs-cu12"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    out["cutlass"] = getattr(cutlass, "__version__", "")
    return out


# The kernels' own measurement switches, read at build time (timing marks written over an input, a product left out):
# a cubin built with one computes something else than the op. Each kernel module reads its switch by this name.
DECODE_TOPK_SWITCH = "DECODE_TOPK_EXPERIMENT"
SPARSE_MLA_SWITCH = "SPARSE_MLA_EXPERIMENT"
MEASUREMENT_SWITCHES = (DECODE_TOPK_SWITCH, SPARSE_MLA_SWITCH)


def _compile_affecting_dsl_variables() -> list:
    """The CUTE_DSL_* variables that CuTe DSL itself declares as changing what it compiles (its settings marked
    affects_compile: debug, line info, compiler options, assertions, ...); every CUTE_DSL_* name where the
    declarations cannot be read (another release's layout)."""
    try:
        from cutlass.base_dsl import env_manager

        names = {f"CUTE_DSL_{v.source}" for cls in vars(env_manager).values() if isinstance(cls, type)
                 for v in vars(cls).values()
                 if isinstance(v, env_manager.EnvVar) and v.affects_compile and isinstance(v.source, str)}
    except (ImportError, AttributeError):
        names = set()
    return sorted(names) if names else sorted(n for n in os.environ if n.startswith("CUTE_DSL_"))


def build_switches() -> dict:
    """The environment variables set for this build that change the cubins' bytes or behaviour: the kernels'
    measurement switches and CuTe DSL's compile settings. The manifest records them, and the runtime refuses a cache
    built with any (a measurement build computes something else than the op, and only --check, which compares with
    a clean build, would tell otherwise)."""
    names = (*MEASUREMENT_SWITCHES, *_compile_affecting_dsl_variables())
    return {n: os.environ[n] for n in names if os.environ.get(n)}


def compiler_versions(launch_fn, *args) -> dict:
    """The CUDA compiler and NVVM versions CuTe DSL reports in the PTX it generates."""
    import re

    with tempfile.TemporaryDirectory(prefix="cute_dump_") as dump:
        options = f"--gpu-arch sm_90a --keep-ptx --dump-dir {dump}"
        ptx = cute.compile(launch_fn, *args, options=options).__ptx__ or ""
    found = {}
    m = re.search(r"Cuda compilation tools, release ([\d.]+), (V[\d.]+)", ptx)
    if m:
        found["cuda_compiler"] = f"{m.group(1)} ({m.group(2)})"
    m = re.search(r"Based on NVVM ([\d.]+)", ptx)
    if m:
        found["nvvm"] = m.group(1)
    return found
