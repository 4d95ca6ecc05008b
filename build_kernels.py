#!/usr/bin/env python3
"""Build the AOT kernel cache: every contract variant -> cubins/<arch>/<name>.cubin + manifests/<arch>.json.

Runs without a GPU (CuTe DSL cross-compiles). Examples:
    python build_kernels.py                      # every family, sm_90a and sm_100a
    python build_kernels.py --only probe --jobs 2
    python build_kernels.py --check              # rebuild in a temp dir, compare with the committed cache
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from multiprocessing import get_context
from pathlib import Path

from filelock import FileLock, SoftFileLock

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux: FileLock's own lock
    fcntl = None

REPO = Path(__file__).resolve().parent
SOURCE_DIRS = ("kernels", "runtime/contract")


def _drop_source_bytecode() -> None:
    """Remove the kernel sources' and the contract's cached bytecode before they are imported: Python reuses a .pyc
    whose recorded mtime (whole seconds) and size match the source, so a same-length edit within a second (or a tool
    that keeps mtimes) compiled the old kernel under the new source hash, and --check passed it. The rest of the
    process's imports keep their caches (CuTe DSL's own would take seconds to rebuild)."""
    for d in SOURCE_DIRS:
        for cache in (REPO / d).rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)  # a read-only checkout: nothing written there, nothing stale


if multiprocessing.parent_process() is None:  # the build itself, not a pool worker importing it
    _drop_source_bytecode()
sys.path.insert(0, str(REPO))

from runtime.contract import (  # noqa: E402
    ARCHS,
    FAMILIES,
    SCHEMA_VERSION,
    all_variants,
    family_contract_hash,
)
from runtime.cubin import kernel_attributes, read_cubin  # noqa: E402
from runtime.errors import CacheError, escape_unencodable_output, rebuild  # noqa: E402
from runtime.manifest import (  # noqa: E402
    ALLOW_MEASUREMENT_BUILD_ENV,
    BUILD_LOCK,
    build_settled,
    check_against_contract,
    check_cache,
    check_cubin_against_entry,
    manifest_from_text,
    manifest_path,
    read_checked_cubin,
    read_manifest,
    sha256_of,
    unnamed_files,
)


def source_hash() -> str:
    """sha256 over the kernel sources and the contract (paths and contents, sorted). Hidden names are left out (an
    editor's lock link such as ``.#ptx.py``, dangling while a file has unsaved edits, stopped every build with a bare
    FileNotFoundError), and so is anything not a regular file."""
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for f in sorted((REPO / d).rglob("*.py")):
            if any(part.startswith(".") for part in f.relative_to(REPO / d).parts) or not f.is_file():
                continue
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _compile_task(task: tuple):
    """``_compile_one(*task)``: what a pool's ``imap`` calls."""
    return _compile_one(*task)


def _worker_ignores_ctrl_c() -> None:
    """A pool worker's initializer: a terminal's Ctrl-C reaches the whole process group, and every worker printed
    its own KeyboardInterrupt traceback over the build's output. The build ends them itself (the pool's exit
    terminates them), so they leave SIGINT to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _compile_one(family: str, name: str, arch: str):
    """Worker: compile one variant for one arch; returns (name, arch, cubin, seconds)."""
    from kernels import compile_variant
    from runtime.contract import family_variants

    variant = next((v for v in family_variants(family) if v.name == name), None)
    if variant is None:  # a LookupError, not next()'s StopIteration, which ends a pool's result iterator silently
        raise LookupError(f"{family} has no variant {name!r} in this contract")
    start = time.perf_counter()
    cubin = compile_variant(variant, arch)
    return name, arch, cubin, time.perf_counter() - start


def manifest_entry(variant, arch: str, cubin: bytes) -> dict:
    """The manifest record of one compiled variant, after checking the cubin against the contract."""
    info = read_cubin(cubin)
    if not info.arch_matches(arch):
        raise SystemExit(f"{variant.name}: compiled for {info.arch}, asked for {arch}")
    if len(info.kernels) != 1:
        raise SystemExit(f"{variant.name} ({arch}): expected one kernel in the cubin, found {sorted(info.kernels)}")
    (symbol, layout), = info.kernels.items()
    required = kernel_attributes(cubin, symbol).required_block
    if required is not None and required != (variant.threads, 1, 1):
        raise SystemExit(f"{variant.name} ({arch}): the kernel was compiled for blocks of {list(required)} threads, "
                         f"the contract launches [{variant.threads}, 1, 1]")
    sizes = [p.size for p in layout]
    if sizes != [p.size for p in variant.params]:
        raise SystemExit(
            f"{variant.name} ({arch}): kernel parameter sizes {sizes} do not match the contract "
            f"{[(p.name, p.ctype) for p in variant.params]}"
        )
    return {
        "name": variant.name,
        "family": variant.family,
        "config": dict(variant.config),
        "symbol": symbol,
        "cubin": f"cubins/{arch}/{variant.name}.cubin",
        "sha256": sha256_of(cubin),
        "size": len(cubin),
        "threads": variant.threads,
        "cluster": list(variant.cluster),
        "non_portable_cluster": variant.non_portable_cluster,
        "smem_bytes": variant.smem_bytes,
        "pdl": variant.pdl,
        "params": [
            {"name": p.name, "ctype": p.ctype, "offset": q.offset, "size": q.size}
            for p, q in zip(variant.params, layout)
        ],
        "contract_hash": family_contract_hash(variant.family),
    }


@functools.cache
def _plain_file_mode() -> int:
    """0666 less the process's umask (read once: reading it means setting it)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _atomic_write(path: Path, data: bytes) -> None:
    _atomic_write_all([(path, data)])


def _atomic_write_all(files: list, last: tuple | None = None) -> None:
    """Write each ``(path, data)`` under a temporary name and sync it, then rename them all into place and sync
    their directories. A write that fails (a full disk, a quota) replaces nothing: file by file, the cubins written
    before it sat under the old manifest, whose sha256s every load then refused. ``last`` (an arch's manifest) is
    written and synced with the others, so that its failed write replaces none of them either, and renamed after
    their renames are on disk."""
    staged = []
    try:
        for path, data in [*files, *([last] if last is not None else [])]:
            staged.append((_staged_copy(path, data), path))
        with _interrupts_deferred():
            try:
                for group in (staged[:len(files)], staged[len(files):]):
                    for tmp, path in group:
                        os.replace(tmp, path)
                    # The renames on disk before whatever is written next: after a crash or power loss the manifest
                    # (renamed last) never names cubins that did not land.
                    for directory in dict.fromkeys(path.parent for _, path in group):
                        _fsync_directory(directory)
            except OSError as e:  # some files may be in place already: not the staging's failure, said apart
                raise _PlacingFailed(e.errno, e.strerror, e.filename) from e
    except BaseException:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise


class _PlacingFailed(OSError):
    """The OSError of renaming an arch's staged files into place or syncing their folders (its errno, message and
    file): unlike a failed staging, which replaces nothing, some of the arch's files may already be the new ones."""


# The signals that end the build (a supervisor's SIGTERM, a closed terminal's or SSH session's SIGHUP, Ctrl-\\'s
# SIGQUIT), where the platform has them.
_EXIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name))


@contextlib.contextmanager
def _interrupts_deferred():
    """SIGINT and _EXIT_SIGNALS held back for the block and raised again after it. Two blocks take it: an arch's
    renames and their folders' syncs (milliseconds: a Ctrl-C or a supervisor's SIGTERM between an arch's cubins'
    renames and its manifest's left the new cubins under the old manifest, whose sha256s every load then refused),
    and a compile in this process (seconds: the exception a handler raises inside CuTe DSL's compiler, which calls
    back into Python, aborted the process through C++'s terminate, or came out as the compiler's RuntimeError, with
    --check's temporary build left behind, in about 1 of 12 signals). SIGKILL cannot be held. Python handlers, not a
    signal mask: a mask is per thread, and any other thread (torch's) took the signal and tripped the main thread's
    handler at once. Outside the main thread no handler can be set."""
    held = [s for s in (signal.SIGINT, *_EXIT_SIGNALS) if signal.getsignal(s) is not None]  # None: not Python's
    if threading.current_thread() is not threading.main_thread():
        held = []
    caught = []
    previous = {}
    try:  # the handlers swapped inside: one that lands between two swaps is still put back, its signal raised again
        for s in held:
            previous[s] = signal.signal(s, lambda signum, _frame: caught.append(signum))
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(caught):  # to the handler it was sent to: KeyboardInterrupt, SystemExit, an exit
            signal.raise_signal(signum)


def _staged_copy(path: Path, data: bytes) -> str:
    """``data`` in a new temporary file beside ``path``, on disk (a renamed file whose data was not synced may come
    back empty after a power loss, which every load refuses); the file is removed if the write fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp makes the file 0600: a cache built by one account (root in an image, a build user for --out)
        # would be unreadable to the account that serves it. The mode open() would give.
        os.fchmod(fd, _plain_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def toolchain_info() -> dict:
    from cutlass import Int32

    from kernels.compile import (
        build_switches,
        compiler_versions,
        null_stream,
        toolchain,
    )
    from kernels.empty import EmptyKernel

    info = toolchain()
    with _interrupts_deferred():  # a compile in this process (_interrupts_deferred says why)
        info.update(compiler_versions(EmptyKernel(1, 32), Int32(0), null_stream()))
    # major.minor only: a patch release changes no cubin, and the manifest should not differ by it
    info["python"] = f"{sys.version_info.major}.{sys.version_info.minor}"
    switches = build_switches()
    if switches:  # recorded, and the runtime refuses the cache (runtime.manifest: MeasurementBuildError)
        info["build_switches"] = switches
    return info


def _warn_of_build_switches() -> None:
    """Said before minutes of compiling: a build with measurement switches or CuTe DSL compile settings set makes a
    cache that the runtime refuses (a measurement loads it on purpose)."""
    from kernels.compile import build_switches

    switches = build_switches()
    if switches:
        shown = ", ".join(f"{k}={v}" for k, v in switches.items())
        print(f"warning: {shown} set: this is a measurement build, which its manifest records and the runtime "
              f"refuses to load unless {ALLOW_MEASUREMENT_BUILD_ENV}=1; unset them for a serving cache",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM (a supervisor, a timeout that signals this process alone), and SIGHUP and SIGQUIT alike, raise
    SystemExit(128 + signal) in the main thread for the block, so that the block's cleanup runs; their default
    actions end the process without any (a hang-up left the staged copies of a write behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, exit_now) for s in _EXIT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def compile_all(variants_by_arch: dict, jobs: int):
    """Compile every (variant, arch); prints one progress line each. Returns {(name, arch): cubin}."""
    tasks = [(v.family, v.name, arch) for arch, vs in variants_by_arch.items() for v in vs]
    results = {}
    start = time.perf_counter()
    if jobs > 1 and len(tasks) > 1:
        # Results as they finish, so that a failed compile stops the build at once; leaving the block terminates
        # the workers (a failure, Ctrl-C, or a SIGTERM to this process alone: an executor's pool compiled every
        # queued variant first, and a SIGTERM left its workers waiting forever).
        before = set(multiprocessing.active_children())
        spawn = get_context("spawn")
        with _sigterm_as_exit(), spawn.Pool(min(jobs, len(tasks)), initializer=_worker_ignores_ctrl_c) as pool:
            workers = [p for p in multiprocessing.active_children() if p not in before]
            results_of = _results_while_workers_live(pool.imap_unordered(_compile_task, tasks), workers)
            for i, (name, arch, cubin, secs) in enumerate(results_of, 1):
                results[(name, arch)] = cubin
                print(f"[{i}/{len(tasks)}] {arch} {name}: {len(cubin)} bytes in {secs:.1f} s", flush=True)
        if len(results) != len(tasks):
            raise SystemExit(f"the build compiled {len(results)} of {len(tasks)} variants")
    else:
        for i, task in enumerate(tasks, 1):
            with _interrupts_deferred():  # a signal ends the build once the variant is compiled (seconds)
                name, arch, cubin, secs = _compile_one(*task)
            results[(name, arch)] = cubin
            print(f"[{i}/{len(tasks)}] {arch} {name}: {len(cubin)} bytes in {secs:.1f} s", flush=True)
    print(f"compiled {len(tasks)} variant(s) in {time.perf_counter() - start:.1f} s", flush=True)
    return results


def _results_while_workers_live(pending, workers: list):
    """The pool's results as they come, and a SystemExit where one of its ``workers`` died: a Pool replaces a worker
    that a signal ended (the OOM killer, a crash in the compiler) and loses its task, so the build waited for that
    result forever (a SIGTERM did not end it either)."""
    while True:
        try:
            yield pending.next(timeout=1.0)
        except StopIteration:
            return
        except multiprocessing.TimeoutError:  # no result this second
            dead = [p for p in workers if p.exitcode is not None]
            if dead:
                raise SystemExit(f"a compile worker (pid {dead[0].pid}) died with exit code {dead[0].exitcode} "
                                 f"(a negative code: killed by that signal, the OOM killer's is -9), and its variant "
                                 f"with it; build again, with fewer --jobs where memory ran out") from None


def write_cache(out: Path, variants_by_arch: dict, cubins: dict, families, *, sources: str | None = None) -> None:
    """Write cubins, then each arch's manifest, each file atomically, under an exclusive lock on ``out``.

    The cache as a whole is not swapped atomically: a load holds the same lock shared while it reads
    (``runtime.manifest.build_settled``), so it waits for these writes to end rather than seeing new cubins under
    the old manifest. A process that had loaded before keeps its kernels (the driver holds their images).
    ``sources``: the source hash taken before the cubins were compiled; the manifest is stamped with it only where
    the sources are still those (an edit or a checkout during the build's minutes stops the build instead).
    """
    _refuse_unusable_folders(out, variants_by_arch)
    out.mkdir(parents=True, exist_ok=True)
    tools, src = toolchain_info(), source_hash()
    if sources is not None and src != sources:
        raise SystemExit("the kernel sources changed while the cubins compiled (source_hash): the manifest would "
                         "stamp cubins of the earlier sources with the new ones; build again")
    whole = set(families) == set(FAMILIES)
    # Every cubin is checked against the contract before any file is written: a variant refused halfway left the
    # earlier variants' new cubins under the old manifest, whose sha256s every load then refused.
    entries_by_arch = {arch: [manifest_entry(v, arch, cubins[(v.name, arch)]) for v in variants]
                       for arch, variants in variants_by_arch.items()}
    with _build_lock(out):
        # A partial build (--only) keeps the other families' entries from the manifests it replaces: read (and
        # refused where unreadable) before any file is written.
        previous_by_arch = {arch: _previous_manifest(manifest_path(out, arch), needed=not whole)
                            for arch in variants_by_arch}
        kept_by_arch = {arch: [] if whole else _checked_kept_entries(out, arch, previous_by_arch[arch], families)
                        for arch in variants_by_arch}
        for arch, kept in kept_by_arch.items():
            if kept:
                _refuse_kept_entries_of_another_toolchain(out, arch, previous_by_arch[arch], tools)
        manifests = {}
        for arch, variants in variants_by_arch.items():
            entries = entries_by_arch[arch]
            previous, kept = previous_by_arch[arch], kept_by_arch[arch]
            # The contract's order whatever was rebuilt, so that rebuilding some families reorders nothing.
            by_name = {e["name"]: e for e in kept + entries}
            manifest = {
                "schema": SCHEMA_VERSION,
                "arch": arch,
                "toolchain": _toolchain_with_kept_switches(tools, previous if kept else None),
                # The sources of the whole cache: a build of some families (--only) that keeps entries keeps the
                # previous stamp, since those were built from the sources it names, not from today's.
                "source_hash": src if whole or previous is None or not kept else previous.get("source_hash", ""),
                "kernels": [by_name[v.name] for v in all_variants(arch) if v.name in by_name],
            }
            text = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
            _check_as_the_runtime_reads(out, arch, text, {v.name: cubins[(v.name, arch)] for v in variants})
            manifests[arch] = manifest, text
        written = []
        for arch, variants in variants_by_arch.items():
            (manifest, text), entries = manifests[arch], entries_by_arch[arch]
            # The manifest is staged with the cubins: a failed write of it (a full disk after the cubins) left the
            # new cubins under the old manifest, whose sha256s every load then refused.
            try:
                _atomic_write_all([(out / entry["cubin"], cubins[(v.name, arch)])
                                   for v, entry in zip(variants, entries)], last=(manifest_path(out, arch), text))
            except _PlacingFailed as e:
                raise SystemExit(_write_failure(out, arch, written, e, placing=True)) from None
            except OSError as e:  # a full disk, a quota: said in one line, with what the cache now holds
                raise SystemExit(_write_failure(out, arch, written, e)) from None
            written.append(arch)
            print(f"wrote {manifest_path(out, arch)} ({len(manifest['kernels'])} kernels)", flush=True)
            _remove_unnamed_files(out, arch, manifest)


def _write_failure(out: Path, arch: str, written: list, error: OSError, placing: bool = False) -> str:
    """The one line a build ends with where writing an arch's files failed (a full disk, a quota; a traceback said
    neither which arch nor what the cache was left holding). A failed staging replaces nothing of the arch;
    ``placing``: the failure came while its files were renamed into place, some of which may be new."""
    where = f" ({error.filename})" if error.filename else ""
    done = f"{', '.join(written)} written new before it; " if written else ""
    if placing:
        return (f"build_kernels.py: placing {arch}'s files in {out} failed: {error.strerror or error}{where}; "
                f"{done}some of {arch}'s cubins may be new under its old manifest, which a load refuses by their "
                f"sha256 (no wrong kernel runs), and the archs after it keep their previous files; mend the folder, "
                f"then build again")
    return (f"build_kernels.py: writing {arch}'s files in {out} failed: {error.strerror or error}{where}; {done}"
            f"{arch} and the archs after it keep their previous files (each arch is written whole or not at all: "
            f"every manifest still matches its cubins); free space or mend the folder, then build again")


def _check_as_the_runtime_reads(out: Path, arch: str, text: bytes, new_cubins: dict) -> None:
    """Run the runtime's reader over a manifest before any file of the build is written: its structure and exact
    field types (runtime.manifest.manifest_from_text), every entry against the contract, and each new cubin's ELF
    against its entry (what a load checks past the sha256). A value the manifest's JSON turns into something the
    reader refuses (a config tuple read back as a list, a float size) would otherwise build "successfully" and be
    refused by every load."""
    try:
        manifest = manifest_from_text(text, manifest_path(out, arch), out, arch, measurement_build_ok=True)
        check_against_contract(manifest)
        for name, data in new_cubins.items():
            entry = manifest.kernels[name]
            check_cubin_against_entry(data, entry, out / entry.cubin, arch, out)
    except CacheError as e:
        raise SystemExit(f"the manifest this build would write for {arch} is refused by the runtime's reader, so no "
                         f"file was written: {e}") from None


# How the build opens its lock file, as FileLock does: for writing, created where missing, never through a symlink.
_BUILD_LOCK_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)


def _build_lock(out: Path):
    """The build's exclusive lock on ``out``: FileLock on BUILD_LOCK, whose flock a load shares (build_settled).

    Where this filesystem has no flock (ENOSYS, ENOLCK: a Lustre mount without it, say), loads read unguarded and
    the builds exclude each other with a marker file of its own name. FileLock's own fallback (filelock 4) makes
    BUILD_LOCK itself the marker, and took the empty one that every load and _require_writable create for the
    marker of an owner it cannot probe: the build waited forever after its compiles."""
    lock = str(out / BUILD_LOCK)
    if fcntl is None:
        return FileLock(lock)
    fd = os.open(lock, _BUILD_LOCK_OPEN_FLAGS, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close
    except BlockingIOError:  # another build holds it: flock works
        pass
    except OSError:  # no flock on this filesystem, as build_settled takes it
        return SoftFileLock(lock + ".soft")
    finally:
        os.close(fd)
    return FileLock(lock)


def _unnamed_files(root: Path, arch: str, manifest: dict) -> list:
    """``unnamed_files`` of a manifest as JSON, which a --check may find malformed: an entry without a string cubin
    names nothing."""
    return unnamed_files(root, arch, [e["cubin"] for e in manifest.get("kernels", [])
                                      if isinstance(e, dict) and isinstance(e.get("cubin"), str)])


def _remove_unnamed_files(out: Path, arch: str, manifest: dict) -> None:
    """After the manifest is in place (under the build lock, so no load is reading and no build is staging): the
    arch's folder keeps only the cubins the manifest names. A folder or a file it cannot remove is left and named."""
    for path in _unnamed_files(out, arch, manifest):
        try:
            if path.is_dir() and not path.is_symlink():
                raise IsADirectoryError(f"{path} is a directory")
            path.unlink()
            print(f"removed {path}: named by no entry of the new manifest", flush=True)
        except OSError as e:
            print(f"warning: left {path}, which no manifest entry names ({e}); remove it", file=sys.stderr, flush=True)


def _previous_manifest(path: Path, *, needed: bool) -> dict | None:
    """The manifest a build replaces, where it is one of this schema with a list of named entries; None where
    there is none. Where ``needed`` (a partial build keeps the other families' entries from it), one that exists
    but cannot be read so stops the build: writing only the rebuilt families would drop the rest from the cache
    (every op would take its fallback), and a malformed entry would crash the build after its cubins were written."""
    if not path.exists():
        return None
    try:
        old = json.loads(path.read_text())
        why = None if isinstance(old, dict) else "not a JSON object"
    except (OSError, ValueError) as e:
        old, why = None, f"unreadable ({e})"
    if why is None and old.get("schema") != SCHEMA_VERSION:
        why = f"of schema {old.get('schema')!r}, not {SCHEMA_VERSION}"
    if why is None and not _named_entries(old.get("kernels")):
        why = "without a list of named kernel entries"
    if why is None:
        return old
    if needed:
        raise SystemExit(f"{path}: --only keeps the other families' entries from this manifest, but it is {why}; "
                         f"build every family (no --only), which rewrites it")
    return None


def _kept_entries(previous: dict | None, families) -> list:
    """Entries of families not rebuilt now, kept from the previous manifest (``--only``)."""
    if previous is None:
        return []
    return [e for e in previous.get("kernels", []) if e.get("family") not in families and e.get("family") in FAMILIES]


def _checked_kept_entries(out: Path, arch: str, previous: dict | None, families) -> list:
    """``_kept_entries``, after the checks a load makes of them (the contract's fields, the cubins' size, sha256,
    ELF arch and parameters): an entry the contract has changed under since (another smem size, a new parameter)
    was kept as it was, and the runtime then refused the whole arch, the families just rebuilt with it."""
    _refuse_misfiled_entries(out, arch, previous, families)
    kept = _kept_entries(previous, families)
    if not kept:
        return kept
    names = {e["name"] for e in kept}
    try:
        manifest = read_manifest(out, arch)
        manifest = manifest._replace(kernels={n: k for n, k in manifest.kernels.items() if n in names})
        check_against_contract(manifest)
        for entry in manifest.kernels.values():
            read_checked_cubin(manifest, entry)
    except CacheError as e:
        raise SystemExit(f"{manifest_path(out, arch)}: --only keeps the other families' entries from this manifest, "
                         f"but the runtime would refuse them: {e}; build every family (no --only), which rebuilds "
                         f"them") from None
    return kept


def _refuse_misfiled_entries(out: Path, arch: str, previous: dict | None, families) -> None:
    """An entry named as a contract variant of a family kept from the previous manifest, but filed under a family
    this build does not know (a hand edit, a corrupt manifest), was dropped as a retired family's: the build wrote a
    manifest without that kernel, removed its cubin and exited 0, and every call of it then took its fallback. (A
    variant of a family rebuilt now is written afresh under its own name.)"""
    family_of = {v.name: v.family for v in all_variants(arch)}
    for entry in (previous or {}).get("kernels", []):
        name, family = entry.get("name"), entry.get("family")
        if name in family_of and family_of[name] not in families and family not in FAMILIES:
            raise SystemExit(f"{manifest_path(out, arch)}: entry {name!r} is filed under family {family!r}, which "
                             f"the contract does not know (it is a {family_of[name]!r} kernel), so --only would drop "
                             f"it; build every family (no --only), which rewrites the manifest")


def _refuse_kept_entries_of_another_toolchain(out: Path, arch: str, previous: dict, tools: dict) -> None:
    """A manifest records one toolchain for all its cubins: --only over entries another toolchain compiled (another
    CuTe DSL, CUDA compiler or Python) stamped them with this build's, so the cache said it was built by what
    built only part of it. Measurement switches are not compared (they are kept: _toolchain_with_kept_switches)."""
    def compilers(toolchain) -> dict:
        return {k: v for k, v in (toolchain if isinstance(toolchain, dict) else {}).items() if k != "build_switches"}

    was, now = compilers(previous.get("toolchain")), compilers(tools)
    if was != now:
        fields = ", ".join(f"{k} {was.get(k)!r} -> {now.get(k)!r}" for k in sorted(was.keys() | now.keys())
                           if was.get(k) != now.get(k))
        raise SystemExit(f"{manifest_path(out, arch)}: --only keeps the other families' entries from this manifest, "
                         f"which another toolchain compiled ({fields}), and a manifest records one toolchain for "
                         f"all its cubins; build every family (no --only), or build with the toolchain it records")


def _toolchain_with_kept_switches(tools: dict, previous: dict | None) -> dict:
    """The new manifest's toolchain: where it keeps entries of a measurement build (``previous``' build_switches),
    their switches stay recorded beside this build's, so the runtime keeps refusing the cache."""
    kept = (previous or {}).get("toolchain", {})
    kept = kept.get("build_switches") if isinstance(kept, dict) else None
    if not kept:
        return tools
    merged = dict(kept) if isinstance(kept, dict) else {"previous build": repr(kept)}
    return {**tools, "build_switches": {**merged, **tools.get("build_switches", {})}}


def _refuse_unusable_folders(out: Path, variants_by_arch: dict) -> None:
    """The build writes into and removes files from ``out/cubins/<arch>/`` and writes ``out/manifests/``: through a
    symlinked folder it would write into, and delete from, another cache outside this one's lock, and make a cache
    that its own runtime refuses (every cache file must resolve inside the root). A file where it makes one of those
    folders, or a folder where it writes a manifest or a cubin, failed the build after its compiles with a bare
    traceback (FileExistsError, IsADirectoryError)."""
    for folder in (out / "cubins", *(out / "cubins" / arch for arch in variants_by_arch), out / "manifests"):
        if folder.is_symlink():
            raise SystemExit(f"{folder}: a symlink (to {os.readlink(folder)}); the build writes only into folders of "
                             f"the cache root itself: replace it with a directory, or build with --out at its target")
        if folder.exists() and not folder.is_dir():
            raise SystemExit(f"{folder}: not a directory, where the build makes one; remove it, or build with "
                             f"another --out")
    for arch, variants in variants_by_arch.items():
        for path in (manifest_path(out, arch), *(out / "cubins" / arch / f"{v.name}.cubin" for v in variants)):
            if path.is_dir() and not path.is_symlink():
                raise SystemExit(f"{path}: a directory, where the build writes a file; remove it, or build with "
                                 f"another --out")


class WholeCacheProblem(str):
    """A --check problem of what a manifest records for all its entries (its source stamp, its toolchain), of the
    manifest itself (unreadable, malformed) or of an entry of a family not checked that the runtime refuses, which
    only a build of every family mends: a build of some families (--only) keeps the other families' source stamp and
    build switches with their entries, and refuses their entries of another compiler or that the runtime refuses and
    a manifest it cannot read (write_cache)."""


def check_against(committed: Path, fresh: Path, archs, families) -> list[str]:
    """Differences between the committed cache and a fresh build: one line per variant (a WholeCacheProblem where
    only a build of every family mends it)."""
    # Under the committed cache's build lock, shared, as a load reads it: a build of that cache writing between its
    # cubins and its manifest made the check report its new cubins as not matching the old manifest.
    with build_settled(committed):
        return _check_against(committed, fresh, archs, families)


def _check_against(committed: Path, fresh: Path, archs, families) -> list[str]:
    problems = []
    for arch in archs:
        try:
            old = json.loads(manifest_path(committed, arch).read_text())
        except (OSError, ValueError) as e:
            problems.append(WholeCacheProblem(f"{arch}: committed manifest unreadable ({e})"))
            continue
        if not _comparable(old):  # the comparison below would crash on it: the runtime's reading names the fault
            problems.append(WholeCacheProblem(_runtime_refusal(committed, arch)
                                              or f"{arch}: committed manifest is malformed"))
            continue
        before = len(problems)
        new = json.loads(manifest_path(fresh, arch).read_text())
        if old.get("source_hash") != new["source_hash"]:
            problems.append(WholeCacheProblem(f"{arch}: kernel sources changed since the committed build "
                                              f"(source_hash)"))
        if old.get("toolchain") != new["toolchain"]:  # what a plain rebuild would rewrite too
            tools = old.get("toolchain") if isinstance(old.get("toolchain"), dict) else {}
            fresh_tools = new["toolchain"]
            # A key held as null on one side and absent on the other differs too (.get() hid which: "()")
            fields = sorted(k for k in tools.keys() | fresh_tools.keys()
                            if k not in tools or k not in fresh_tools or tools[k] != fresh_tools[k])
            problems.append(WholeCacheProblem(f"{arch}: toolchain differs from the committed build's "
                                              f"({', '.join(fields)})"))
        # Fields no build writes (the runtime reads past them), and the entries' order (the contract's: a build
        # writes it whatever was rebuilt), were not compared: a committed manifest unlike any build passed.
        unwritten = sorted(k for k in old if k not in new)
        if unwritten:
            problems.append(f"{arch}: committed manifest has fields no build writes ({', '.join(unwritten)})")
        order = [e["name"] for e in old.get("kernels", []) if e.get("family") in families]
        fresh_order = [e["name"] for e in new["kernels"] if e["family"] in families]
        if order != fresh_order and sorted(order) == sorted(fresh_order):
            problems.append(f"{arch}: committed manifest lists its kernels in another order than the contract's")
        old_by_name = {e["name"]: e for e in old.get("kernels", [])}
        for e in new["kernels"]:
            if e["family"] not in families:
                continue
            o = old_by_name.get(e["name"])
            if o is None:
                problems.append(f"{arch} {e['name']}: missing from the committed manifest")
            elif o.get("sha256") != e["sha256"]:
                problems.append(f"{arch} {e['name']}: cubin sha256 differs from the committed one")
            elif o != e:  # what the loader trusts at launch (smem, cluster, pdl, threads, params...)
                fields = sorted(k for k in e.keys() | o.keys() if o.get(k) != e.get(k))
                problems.append(f"{arch} {e['name']}: committed manifest entry differs in {', '.join(fields)}")
            else:
                try:
                    if sha256_of((committed / o["cubin"]).read_bytes()) != o["sha256"]:
                        problems.append(f"{arch} {e['name']}: committed cubin does not match its manifest")
                except OSError:
                    problems.append(f"{arch} {e['name']}: committed cubin missing")
        built = {e["name"] for e in new["kernels"]}
        for name, o in old_by_name.items():
            if name not in built and (o.get("family") in families or o.get("family") not in FAMILIES):
                problems.append(f"{arch} {name}: in the committed manifest but not built from the sources")
        for path in _unnamed_files(committed, arch, old):
            problems.append(f"{arch} {path.relative_to(committed)}: in the committed cache, named by no manifest "
                            f"entry (a variant the sources no longer define, or a killed build's temporary file)")
        if len(problems) == before:
            # Python's == above takes 1 for true and 128.0 for 128 and a dict keeps one of two equal names: what the
            # runtime reads (exact JSON types, no duplicates, schema, arch, the contract) must accept it too.
            refusal = _runtime_refusal(committed, arch, rebuilt=built)
            if refusal is not None:
                problems.append(refusal)
    return problems


def _check_fix(args: argparse.Namespace, families: tuple, problems: list) -> str:
    """What a failed --check tells to run: a build of what it checked, its --arch, --out and --only, so that the
    command rebuilds the cache and the families checked; without --only where a problem is a WholeCacheProblem (a
    partial build would leave the check failing, or refuse)."""
    from kernels.compile import build_switches

    switches = build_switches()
    if switches:  # the check's own build was a measurement build: a rebuild with them set would fail it again
        return (f"this check's build ran with {', '.join(switches)} set, which its manifests record: unset "
                f"{'it' if len(switches) == 1 else 'them'} and check again")
    fix = rebuild(" ".join(args.arch), args.out)
    if not args.only:
        return f"run: {fix}"
    if any(isinstance(p, WholeCacheProblem) for p in problems):
        return f"--only cannot mend a manifest's source stamp, toolchain or form, or an entry it keeps; run: {fix}"
    return f"run: {fix}" + "".join(f" --only {family}" for family in families)


def _comparable(old) -> bool:
    """Whether check_against can index the committed manifest: an object whose kernels are objects with a name."""
    return isinstance(old, dict) and _named_entries(old.get("kernels", []))


def _named_entries(kernels) -> bool:
    """Whether a manifest's ``kernels`` can be read by name: a list of objects, each with a string name."""
    return isinstance(kernels, list) and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in kernels)


def _runtime_refusal(committed: Path, arch: str, rebuilt=()) -> str | None:
    """The problem line where the runtime refuses the committed manifest or a cubin it names (a symlink out of the
    cache root, a wrong ELF header: every CPU-side check of a load), else None. A WholeCacheProblem unless it refuses
    an entry the check rebuilt (``rebuilt``) in a manifest the runtime reads: a build of some families (--only)
    refuses to keep one it would not rebuild, and reads the whole manifest before it keeps any (an entry of a
    rebuilt family with a float size or a name given twice stops it too), so it mends no refusal of the manifest's
    reading."""
    try:
        check_cache(committed, arch)
    except CacheError as e:
        line = f"{arch}: the runtime refuses the committed manifest ({e})"
        if not (isinstance(e.kernel, str) and e.kernel in rebuilt):
            return WholeCacheProblem(line)
        try:
            read_manifest(committed, arch)  # as _checked_kept_entries reads it
        except CacheError:
            return WholeCacheProblem(line)
        return line
    return None


def _folder(text: str) -> Path:
    """A folder option's path; an empty one is refused: Path("") is the current directory, so ``--out "$UNSET"``
    would build into (and clean) whatever folder the command ran in."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no folder (it would be the current directory); name "
                                         "the folder, '.' for the current one")
    return Path(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The build options default to None so that --warm-deepgemm can tell which were given (it takes none).
    parser.add_argument("--arch", nargs="+", action="extend", choices=ARCHS,
                        help=f"archs to build (repeatable; default: {' '.join(ARCHS)})")
    parser.add_argument("--only", action="append", choices=FAMILIES, help="build only this family (repeatable)")
    parser.add_argument("--jobs", type=int, help="parallel compile processes (default 1)")
    parser.add_argument("--out", type=_folder, help="cache root (holds cubins/ and manifests/; default: this checkout)")
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temp dir and fail if anything differs from the cache at --out")
    parser.add_argument("--warm-deepgemm", action="store_true",
                        help="on a GPU machine: fill DeepGEMM's JIT cache for the serving shapes below, then exit")
    warm = parser.add_argument_group("serving shapes of --warm-deepgemm (the indexer's scoring on one rank)")
    for option, (field_name, what) in _SERVING_SHAPE_OPTIONS.items():
        warm.add_argument(option, type=int, dest=field_name, metavar="N",
                          help=f"{what} (default {_serving_default(field_name)})")
    warm.add_argument("--deepgemm-cache-dir", type=_folder, metavar="DIR",
                      help="DeepGEMM's JIT cache directory (DG_JIT_CACHE_DIR; default: DeepGEMM's own)")
    args = parser.parse_args(argv)
    build_options_given = [option for option, value in _build_options(args).items()
                           if value is not None and value is not False]
    args.arch = list(dict.fromkeys(args.arch)) if args.arch else list(ARCHS)  # each once, in the order given
    args.jobs = 1 if args.jobs is None else args.jobs
    args.out = REPO if args.out is None else args.out
    shape_options = {}
    for option, (field_name, _) in _SERVING_SHAPE_OPTIONS.items():
        value = getattr(args, field_name)
        if value is not None and value < 1:
            parser.error(f"{option}: {value} must be at least 1")
        if value is not None:
            shape_options[field_name] = value
    if not args.warm_deepgemm and (shape_options or args.deepgemm_cache_dir is not None):
        parser.error(f"{', '.join(_SERVING_SHAPE_OPTIONS)} and --deepgemm-cache-dir go with --warm-deepgemm")

    if args.warm_deepgemm:
        if build_options_given:
            parser.error(f"--warm-deepgemm fills DeepGEMM's cache and builds no cubins: drop "
                         f"{', '.join(build_options_given)} (run the build as its own command)")
        return _warm_deepgemm(parser, shape_options, args.deepgemm_cache_dir)
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} must be at least 1")
    cpus = len(os.sched_getaffinity(0))
    if args.jobs > cpus:  # compiles are CPU-bound, each process ~340 MB: --jobs 100 on 2 CPUs peaked at 10.7 GB
        print(f"--jobs {args.jobs}: this process may use {cpus} CPU(s); compiling with --jobs {cpus}",
              file=sys.stderr, flush=True)
        args.jobs = cpus
    families = tuple(dict.fromkeys(args.only or FAMILIES))  # each once, as --arch: all_variants refuses repeats
    variants_by_arch = {arch: all_variants(arch, families) for arch in args.arch}
    for arch in args.arch if args.only else ():
        unbuilt = [f for f in dict.fromkeys(families) if not all_variants(arch, (f,))]
        if unbuilt:  # it would compile nothing of them and still rewrite the manifest (or pass a check)
            has = [a for a in ARCHS if all(all_variants(a, (f,)) for f in unbuilt)]
            fix = f"build it with --arch {' '.join(has)}" if has else "name the archs it has (--arch)"
            parser.error(f"--only {' '.join(unbuilt)}: the contract has no variant of it for {arch}; {fix}, or drop "
                         f"that --only")
    _require_cute_dsl(parser)
    if args.check:
        _refuse_a_file(parser, args.out)  # its fix would name a build the build refuses, after minutes of compiling
        _refuse_no_cache_to_check(parser, args.out, args.arch)
        _warn_of_build_switches()  # the check's build records them: every manifest then differs
        # SIGTERM (a CI job's timeout) as SystemExit, so that the temporary build is removed: its default action
        # left it behind, cubins and all, whenever the compiles ran in this process (--jobs 1) or it wrote
        with _sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="aot_check_") as tmp:
            sources = source_hash()
            cubins = compile_all(variants_by_arch, args.jobs)
            write_cache(Path(tmp), variants_by_arch, cubins, FAMILIES, sources=sources)
            problems = check_against(args.out, Path(tmp), args.arch, families)
        for p in problems:
            print(f"CHECK FAILED: {p}")
        print("check passed" if not problems else f"check failed: {len(problems)} difference(s); "
              f"{_check_fix(args, families, problems)}")
        return 1 if problems else 0
    _require_writable(parser, args.out)  # before minutes of compiling, not after
    _refuse_unusable_folders(args.out, variants_by_arch)
    _require_writable_folders(parser, args.out, variants_by_arch)
    _warn_of_build_switches()
    sources = source_hash()
    with _sigterm_as_exit():  # as SystemExit, so that a write it stops removes its staged copies
        cubins = compile_all(variants_by_arch, args.jobs)
        write_cache(args.out, variants_by_arch, cubins, families, sources=sources)
    return 0


def _build_options(args: argparse.Namespace) -> dict:
    """The cubin build's options as parsed (None or False where not given), by their command-line names."""
    return {"--arch": args.arch, "--only": args.only, "--jobs": args.jobs, "--out": args.out, "--check": args.check}


# --warm-deepgemm's shape options: the ServingShapes field each sets, and what it is.
_SERVING_SHAPE_OPTIONS = {
    "--max-rows": ("max_rows", "decode rows a step scores on one rank"),
    "--index-heads": ("heads", "index heads (Hopper: 32 or 64)"),
    "--index-head-dim": ("head_dim", "index head dim (64 or 128)"),
}


def _serving_default(field_name: str):
    from runtime.scoring import ServingShapes

    return getattr(ServingShapes(), field_name)


def _warm_deepgemm(parser: argparse.ArgumentParser, shape_options: dict, cache_dir: Path | None) -> int:
    """Fill DeepGEMM's JIT cache for the given serving shapes (the rest at ServingShapes' defaults) and print what it
    compiled, as JSON: a deployment warms for its own model (heads, head dim) and its largest step per rank."""
    from runtime.scoring import (
        ServingShapes,
        deepgemm_status,
        use_jit_cache_dir,
        warm_deepgemm,
    )

    use_jit_cache_dir(cache_dir)  # before deepgemm_status imports DeepGEMM, which reads it then
    ok, why = deepgemm_status()
    if not ok:  # no CUDA device, or no DeepGEMM that runs here: said without a traceback
        print(f"build_kernels.py: --warm-deepgemm: {why}; it warms DeepGEMM for the GPU it runs on: run it on each "
              f"serving GPU model (sm_90 or sm_100), with DeepGEMM installed (pip install -e \".[deepgemm]\")",
              file=sys.stderr, flush=True)
        return 1
    try:
        report = warm_deepgemm(ServingShapes(**shape_options), cache_dir)
    except ValueError as e:  # shapes DeepGEMM does not take on this GPU: its scorer names them
        parser.error(f"--warm-deepgemm: {e}")
    print(json.dumps(report, indent=1), flush=True)
    return 0


ANY_CUTE_DSL_ENV = "SPARSE_DECODE_AOT_ANY_CUTE_DSL"  # "1": build with another release (trying one out)


def cute_dsl_pin() -> str | None:
    """The CuTe DSL release the kernels are written for, as setup.cfg's 'build' extra pins it (its API moves between
    releases), or None where the checkout has no such pin to read."""
    import configparser

    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    for requirement in extras.get("options.extras_require", "build", fallback="").split():
        name, _, version = requirement.partition("==")
        if name == "nvidia-cutlass-dsl" and version:
            return version
    return None


def _require_cute_dsl(parser: argparse.ArgumentParser) -> None:
    """The build and --check compile with CuTe DSL, the 'build' extra: without it (a plain ``pip install -e .``)
    they stopped in a bare ModuleNotFoundError traceback. Another release than the pin built and stamped its version
    in the manifest without a word (only a later --check said the toolchain differs, and its fix, a rebuild with
    that release, stamped it again); it is refused, naming both versions."""
    try:
        importlib.import_module("cutlass")
    except ImportError as e:
        parser.error(f"the build compiles with CuTe DSL (nvidia-cutlass-dsl), which does not import here ({e}); "
                     f"install the 'build' extra: pip install -e \".[build]\"")
    try:
        installed = importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:  # importable without its distribution's metadata (a source tree)
        return
    pin = cute_dsl_pin()
    if pin is not None and installed != pin and os.environ.get(ANY_CUTE_DSL_ENV, "") in ("", "0"):
        parser.error(f"nvidia-cutlass-dsl {installed} is installed, the kernels are written for {pin} (the 'build' "
                     f"extra's pin): pip install -e \".[build]\" (or set {ANY_CUTE_DSL_ENV}=1 to build with "
                     f"{installed})")


def _refuse_a_file(parser: argparse.ArgumentParser, out: Path) -> None:
    """An --out that names a file, refused with the fix (mkdir's "File exists", or --check's unreadable manifest
    whose fix was a build of that file, named none)."""
    try:
        a_file = out.exists() and not out.is_dir()
    except OSError as e:  # exists() answers False only for a missing path: a name too long, a folder it cannot search
        parser.error(f"--out {out}: cannot be looked up ({e.strerror or e}); name a directory this account can reach")
    if a_file:
        parser.error(f"--out {out}: a file, not a directory; name the cache root's directory (made where missing)")
    if out.is_symlink() and not out.exists():  # mkdir's "File exists" named neither the link nor where it led
        parser.error(f"--out {out}: a symlink to {os.readlink(out)}, which leads to no directory; remove the link or "
                     f"name the directory itself")


def _refuse_no_cache_to_check(parser: argparse.ArgumentParser, out: Path, archs: list) -> None:
    """--check of a folder with no manifest of the archs it checks (a mistyped --out, a cache not built yet), refused
    with the fix: it compiled every variant asked (minutes) before saying that each manifest was unreadable. One
    arch's manifest missing among others is still the check's to report, beside the others' differences."""
    for arch in archs:  # lexists() answers False for a manifest it cannot look up: the fix was a build, refused too
        try:
            os.lstat(manifest_path(out, arch))
        except FileNotFoundError:
            continue
        except OSError as e:
            parser.error(f"--check --out {out}: cannot look up {manifest_path(out, arch)} ({e.strerror or e}); name "
                         f"the root of a built cache this account can read")
        return
    parser.error(f"--check --out {out}: no manifest of {' '.join(archs)} to check in {out / 'manifests'}; name "
                 f"the root of a built cache, or build one: {rebuild(' '.join(archs), out)}")


def _require_writable(parser: argparse.ArgumentParser, out: Path) -> None:
    """Refused before minutes of compiling: an --out the build cannot write, or whose build lock it cannot open for
    writing (a lock file that a load by another account created with that account's umask)."""
    _refuse_a_file(parser, out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        parser.error(f"--out {out}: not a writable directory ({e.strerror or e}); name a directory this account can "
                     f"write")
    lock = out / BUILD_LOCK
    try:
        # Not through a symlink: FileLock opens the lock with O_NOFOLLOW, so a symlinked lock passed here and failed
        # the build after its compiles (ELOOP, a traceback), and a load does too (it then reads unguarded).
        os.close(os.open(lock, _BUILD_LOCK_OPEN_FLAGS, 0o666))
    except OSError as e:
        if lock.is_symlink():
            why, fix = f"a symlink to {os.readlink(lock)}, which no lock follows", "remove the link"
        else:
            why, fix = e.strerror or e, "let this account write it, or remove it"
        parser.error(f"--out {out}: cannot open its build lock {lock} for writing ({why}); {fix} (a load creates it "
                     f"again)")


def _require_writable_folders(parser: argparse.ArgumentParser, out: Path, archs) -> None:
    """The folders the build stages, renames and removes files in (each arch's cubin folder, ``manifests/``), or the
    nearest one that exists where they do not yet: a cache root this account can write holding folders it cannot
    (a cache another account built, an image's) passed _require_writable and failed the build after its compiles,
    with a bare PermissionError at the first staged cubin."""
    probed = {out}  # _require_writable wrote in it; each folder once (cubins/ stands in for every missing arch)
    for folder in (*(out / "cubins" / arch for arch in archs), out / "manifests"):
        existing = next(f for f in (folder, *folder.parents) if f.is_dir())  # out at the latest: it was made
        if existing in probed:
            continue
        probed.add(existing)
        try:
            tempfile.TemporaryFile(dir=existing).close()
        except OSError as e:
            parser.error(f"--out {out}: cannot write in {existing} ({e.strerror or e}), where the build writes "
                         f"{folder.relative_to(out)}/; let this account write it, or build with another --out")


def _command_line(argv=None) -> int:
    """``main`` for the command line: a Ctrl-C ends it with one line and the shell's status 130, as a SIGTERM ends it
    with 143, not with a traceback. The cleanup ran on the way out (staged copies and --check's temporary build
    removed), and a signal during an arch's renames waits for its manifest, so each arch's manifest still names
    the cubins beside it."""
    escape_unencodable_output()  # an --out whose name is no UTF-8, printed after an arch was written
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("build_kernels.py: interrupted; every arch's manifest still matches its cubins (each arch is written "
              "whole or not at all): run the build again to finish it", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(_command_line())
