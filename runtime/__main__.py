"""``python -m runtime verify``: list, validate and self-test the cache on this GPU; ``--files-only`` checks the cache's
files without a GPU or driver."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .contract import ARCHS

NO_DEVICE_HINT = ("  (`python -m runtime verify --files-only` checks the cache's files without a GPU: every check "
                  "a load makes before the driver)")
PROBE_OK = ("ok (words exchanged through DSMEM in clusters; each second launch, released to start beside the first, "
            "read the first's words after its dependency wait)")


def verify(root=None) -> int:
    from . import load
    from .errors import CacheError, CacheLoadInterrupted, NoDriverError, rebuild
    from .manifest import check_cache
    from .probe import run_probe

    start = time.perf_counter()
    try:
        cache = load(root)
    except (CacheError, RuntimeError) as e:
        print(f"FAIL: {e}")
        if isinstance(e, NoDriverError):
            print(NO_DEVICE_HINT)
        return 1
    seconds = time.perf_counter() - start
    m = cache.manifest
    try:
        # What load() leaves to the driver, checked on the ELF too: each kernel's symbol and its
        # full parameter list in the cubin's .nv.info attributes (and the entries against the contract again).
        check_cache(m.root, m.arch)
    except (CacheError, CacheLoadInterrupted) as e:  # interrupted: a build took the lock since the load
        print(f"FAIL (ELF sections): {e}")
        return 1
    print(f"manifest {m.path} (arch {m.arch}, schema ok, source {m.source_hash[:12]}, toolchain "
          f"{m.toolchain.get('nvidia-cutlass-dsl', '?')})")
    for name in cache.names():
        e = cache.kernel(name).entry
        print(f"  ok {name:40s} {e.family:18s} cluster {e.cluster} threads {e.threads} smem {e.smem_bytes} "
              f"pdl {e.pdl} resident clusters {cache.kernel(name).max_active_clusters}")
    print(f"loaded and validated {len(cache.names())} kernels in {seconds * 1e3:.1f} ms; every entry matches the "
          f"runtime's contract; ELF symbols and parameter lists match the manifest")
    failed = 0
    try:
        results = run_probe(cache)
    except RuntimeError as e:  # a probe launch refused or faulted (CudaCallError, torch's CUDA error): a FAIL line
        print(f"  probe: FAIL {type(e).__name__}: {e}")
        print("verify: FAILED")
        return 1
    if not results:  # nothing launched, nothing proved: the self-test is the probe kernels
        print(f"  probe: FAIL the manifest has no probe kernel to launch; rebuild with them: "
              f"{rebuild(m.arch, m.root)}")
        failed = 1
    for name, problem in results.items():
        print(f"  probe {name}: {PROBE_OK if problem is None else 'FAIL ' + problem}")
        failed += problem is not None
    print("verify: " + ("FAILED" if failed else "all checks passed"))
    return 1 if failed else 0


def _say_unknown_manifests(root) -> None:
    """A manifest of an arch this runtime does not know (a newer build's) is never loaded: say so, not fail, so
    that a cache shipped for a newer runtime is not taken as checked here."""
    from .manifest import manifest_path

    folder = manifest_path(root, ARCHS[0]).parent
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError:  # a folder it cannot list (a name too long, no permission): each arch's check names why
        return
    for path in paths:
        if path.stem not in ARCHS:
            print(f"skip {path.stem}: {path} names an arch this runtime does not know ({', '.join(ARCHS)}), so no "
                  f"load reads it and it was not checked; serve that arch with a runtime that knows it")


def _say_unnamed_files(manifest) -> None:
    """The files of the arch's cubin folder that no entry names (a dropped variant's cubin, a killed build's staged
    copy) and a killed build's staged copies of its manifest: no load reads them, but an install ships them; said,
    not failed (``build_kernels.py --check`` fails them and a build removes them)."""
    from .manifest import unnamed_files

    root = Path(manifest.root)
    unnamed = [str(p.relative_to(root)) for p in unnamed_files(root, manifest.arch,
                                                                [e.cubin for e in manifest.kernels.values()])]
    if unnamed:
        print(f"note {manifest.arch}: {root} holds {len(unnamed)} file(s) no manifest entry names "
              f"({', '.join(unnamed[:5])}{', ...' if len(unnamed) > 5 else ''}); no load reads them, a build of the "
              f"arch removes them")


def _manifest_stands(path) -> bool:
    """Whether anything stands at an arch's manifest path (a dangling link, a folder, a FIFO, one this process cannot
    stat), or a file stands where the root or its manifests/ folder should be: check_cache then names what a load
    would refuse (a rebuild does not mend a file in the root's place: the build refuses that --out). Only an absent
    one means the cache has no such arch."""
    import os

    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def _say_orphaned_cubins(root, archs) -> int:
    """FAIL each arch of the runtime that ``archs`` (those with a manifest) leaves out but whose cubin folder, or a
    killed build's staged manifest, holds files: a cache that lost a whole manifest, whose cubins no load reads (that
    arch's GPUs would take the torch fallback on every call). Returns how many were failed."""
    from .errors import rebuild
    from .manifest import unnamed_files

    failed = 0
    for arch in ARCHS:
        if arch in archs:
            continue
        try:
            files = [str(p.relative_to(root)) for p in unnamed_files(root, arch, [])]
        except OSError as e:  # a cubin folder that cannot be listed
            files = [f"cubins/{arch} (unlistable: {e})"]
        if files:
            print(f"FAIL {arch}: {root} holds {len(files)} file(s) of {arch} ({', '.join(files[:3])}"
                  f"{', ...' if len(files) > 3 else ''}) but no manifest of it: no load reads them, and an {arch} GPU "
                  f"would take the torch fallback on every call. Fix: {rebuild(arch, root)}")
            failed += 1
    return failed


def verify_files(root=None, archs=()) -> int:
    """``verify --files-only``: every check a load makes before the driver (the manifest's schema, its entries against
    the runtime's contract, each cubin's size, hash, ELF header, symbol and parameter list), for each arch in ``archs``
    or else each arch the cache has a manifest for; no GPU or driver needed, so an image build or a CPU-only host can
    check the cache it ships. The device's own checks (arch, shared memory, cluster shape) and the probe need a GPU."""
    from .errors import CacheError, CacheLoadInterrupted, rebuild
    from .manifest import check_cache, manifest_path, resolved_root

    try:
        root = resolved_root(root)
    except CacheError as e:
        print(f"FAIL: {e}")
        return 1
    named = bool(archs)
    if not named:
        _say_unknown_manifests(root)
    archs = list(dict.fromkeys(archs)) or [arch for arch in ARCHS if _manifest_stands(manifest_path(root, arch))]
    if not archs:
        print(f"FAIL: {root} holds no manifest of {', '.join(ARCHS)}. Fix: {rebuild(None, root)}")
        return 1
    failed = 0
    for arch in archs:
        try:
            m = check_cache(root, arch)
        except (CacheError, CacheLoadInterrupted) as e:
            print(f"FAIL {arch}: {e}")
            failed += 1
            continue
        if not m.kernels:  # no build writes one (--only keeps the other entries): a cache that serves nothing
            print(f"FAIL {arch}: manifest {m.path} lists no kernel; nothing of this arch would load. Fix: "
                  f"{rebuild(arch, m.root)}")
            failed += 1
            continue
        print(f"ok {arch}: manifest {m.path} (schema ok, source {m.source_hash[:12]}, toolchain "
              f"{m.toolchain.get('nvidia-cutlass-dsl', '?')}), {len(m.kernels)} kernels: every entry matches the "
              f"runtime's contract; cubin sizes, hashes, ELF symbols and parameter lists match the manifest")
        try:
            _say_unnamed_files(m)
        except OSError as e:  # a cubin folder that cannot be listed: the arch's files checked out, the note cannot say
            print(f"note {arch}: the files of {m.root} no manifest entry names cannot be listed ({e})")
    if not named:
        failed += _say_orphaned_cubins(root, archs)
    print("verify --files-only: " + ("FAILED" if failed else "all checks passed (no device checked: run `python -m "
                                      "runtime verify` on each GPU model before serving)"))
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="validate every cubin for this GPU and run the probe")
    v.add_argument("--root", default=None, help="cache root (default: $SPARSE_DECODE_AOT_CACHE, else this checkout's "
                   "cache, else the installed one)")
    v.add_argument("--files-only", action="store_true", help="check the cache's files without a GPU or driver: every "
                   "check a load makes before the driver, for each arch with a manifest (or each --arch)")
    v.add_argument("--arch", action="append", default=[], choices=ARCHS, help="with --files-only: check this arch's "
                   "manifest, which must exist (repeatable; default: every arch the cache has a manifest for)")
    args = parser.parse_args(argv)
    from .errors import escape_unencodable_output

    escape_unencodable_output()
    if args.arch and not args.files_only:
        parser.error("--arch goes with --files-only (verify on a GPU checks the arch of that GPU)")
    return verify_files(args.root, args.arch) if args.files_only else verify(args.root)


if __name__ == "__main__":
    sys.exit(main())
