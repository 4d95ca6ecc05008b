"""The manifest: one JSON per arch describing every cubin of the cache.

Reading and the CPU-side checks of a cubin (path, size, sha256, ELF arch, symbol,
parameter layout) live here so that the build, the loader, CI tests and
``python -m runtime verify`` share them; the device-side checks are in loader.py.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import NamedTuple

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux: build_settled reads unguarded
    fcntl = None

from .contract import (
    ARCHS,
    C_TYPE_SIZES,
    SCHEMA_VERSION,
    all_variants,
    family_contract_hash,
)
from .cubin import (
    STB_GLOBAL,
    STB_WEAK,
    STT_FUNC,
    CubinFormatError,
    KernelAttributes,
    check_section_table,
    kernel_attributes,
    read_cubin,
    read_header,
    symbol_table_entries,
)
from .errors import (
    REBUILD,
    BlockShapeError,
    CacheLoadInterrupted,
    ContractMismatchError,
    CubinArchError,
    CubinIntegrityError,
    DuplicateKernelError,
    MeasurementBuildError,
    MissingCubinError,
    ParamLayoutError,
    PathError,
    SchemaError,
    SymbolError,
    rebuild,
    shell_word,
)

CACHE_ROOT_ENV = "SPARSE_DECODE_AOT_CACHE"
# The cache root's build lock: build_kernels.py holds it exclusively while it writes cubins and manifests, a load
# holds it shared while it reads them (build_settled).
BUILD_LOCK = ".build.lock"
BUILD_WAIT_S = 30.0  # a build holds the lock for its writes only (milliseconds), not while it compiles

_ENTRY_FIELDS = (
    "name", "family", "config", "symbol", "cubin", "sha256", "size", "threads",
    "cluster", "non_portable_cluster", "smem_bytes", "pdl", "params", "contract_hash",
)


# NamedTuples, not frozen dataclasses: ``import runtime`` and building one entry per kernel are
# part of the measured cold start of ``runtime.load()`` (a frozen dataclass costs ~0.4 ms to
# define and several times a NamedTuple's time to construct).
class ParamEntry(NamedTuple):
    name: str
    ctype: str
    offset: int
    size: int


class KernelEntry(NamedTuple):
    name: str
    family: str
    config: dict
    symbol: str
    cubin: str  # relative to the cache root
    sha256: str
    size: int
    threads: int
    cluster: tuple
    non_portable_cluster: bool
    smem_bytes: int
    pdl: bool
    params: tuple  # of ParamEntry
    contract_hash: str  # the contract sources it was compiled against (contract.family_contract_hash)

    @property
    def cluster_size(self) -> int:
        return self.cluster[0] * self.cluster[1] * self.cluster[2]


class Manifest(NamedTuple):
    path: Path
    root: Path
    arch: str
    toolchain: dict
    source_hash: str
    kernels: dict  # name -> KernelEntry, in manifest order


def default_root() -> Path:
    """The cache root: $SPARSE_DECODE_AOT_CACHE, the checkout, or the installed data."""
    env = os.environ.get(CACHE_ROOT_ENV)
    if env:
        if not os.path.isabs(env):  # would be read against whatever the working directory is at each call
            raise PathError(f"${CACHE_ROOT_ENV} is the relative path {env!r}.", file=env,
                            fix=f"set {CACHE_ROOT_ENV} to an absolute path (the cache root holding manifests/)")
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    if _holds_a_cache(here):
        return here
    import site
    import sys
    import sysconfig

    # A plain `pip install .` puts the data files under its scheme's data path: sys.prefix in a venv, but /usr/local
    # for Debian's and Ubuntu's system Python (whose sys.prefix is /usr), or the user base for --user.
    try:
        data = sysconfig.get_path("data") or sys.prefix
    except (KeyError, AttributeError, ImportError, OSError, ValueError):  # an odd scheme or no _sysconfigdata
        data = sys.prefix
    # This package's own data first, not another install's (a root `pip install` into /usr/local, the scheme's data
    # path, of another version): pip puts it in <prefix>/share for a package in <prefix>/lib/pythonX.Y/site-packages,
    # whatever the running interpreter's prefix (--user, --prefix, a base install seen from a venv with
    # --system-site-packages), and in <dir>/share for `pip install --target <dir>`.
    own = [here.parents[2]] if len(here.parents) > 2 else []
    bases = [*own, here, data, sys.prefix, *([site.USER_BASE] if site.USER_BASE else [])]
    for base in bases:
        candidate = Path(base) / "share" / "sparse_decode_aot"
        if _holds_a_cache(candidate):
            return candidate
    return Path(data) / "share" / "sparse_decode_aot"


def _holds_a_cache(folder: Path) -> bool:
    """A cache root holds both manifests/ and cubins/: installed, the runtime's package sits in site-packages, where
    another distribution's top-level ``manifests`` package alone would have made site-packages look like a checkout."""
    return (folder / "manifests").is_dir() and (folder / "cubins").is_dir()


def resolved_root(root: str | Path | None = None) -> Path:
    """``root`` (default: ``default_root()``) with every symlink resolved; a PathError where that fails: a symlink
    loop raised pathlib's RuntimeError before Python 3.13, which is no refusal to the host ops (every call raised it)."""
    if root == "":  # Path("") is the current folder: "$UNSET" would check whatever folder the command ran in
        raise PathError("the cache root passed in is an empty path, which names no folder (it would be the "
                        "current one).", fix="pass the folder holding manifests/ and cubins/, '.' for the current one")
    path = Path(root) if root is not None else default_root()
    try:
        return path.resolve()
    except (RuntimeError, OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise PathError(f"the cache root cannot be resolved ({e}).", file=path, fix=_POINT_AT_A_ROOT) from None


_POINT_AT_A_ROOT = f"point ${CACHE_ROOT_ENV} (or the root passed in) at a folder holding manifests/ and cubins/"


def _read_access(root) -> str:
    """The fix where the cache's files cannot be read (a build under umask 077, served by another user): a rebuild
    into a root the serving user cannot write would fail."""
    return f"let the serving user read the cache root: chmod -R a+rX {shell_word(root)} (or build it under umask 022)"


# A real manifest is tens of KiB and a real cubin 10-300 KiB. The bounds keep a crafted file from filling memory, and
# the checks' time with it: a 64 MiB cubin of 4M parameter records or 2.8M symbols took 4-11 s to refuse, and a 16 MiB
# manifest of nested empty lists 2.6 s to pass (a fuzz of the readers, eightieth session).
MANIFEST_MAX_BYTES = 1 << 20
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # hashlib's hexdigest of a SHA-256
CUBIN_MAX_BYTES = 4 << 20  # an entry's size is the read's bound, so it is bounded too


def _json_object(pairs: list) -> dict:
    """A JSON object of the manifest, refusing a key that appears twice (json would keep the last silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"key {twice!r} appears twice in one object")
    return obj


# A \uD800-\uDFFF escape is the only way to a lone surrogate in strictly decoded UTF-8 JSON (one would fail to
# encode later, in a symbol or a message). A manifest holds none, so the whole data is re-encoded only then.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _parse_manifest(text: bytes):
    """Strict UTF-8 JSON (json.loads of bytes would also take UTF-16/32 and a byte-order mark) with no key twice in
    an object and no lone surrogate in a string; ValueError (or RecursionError) where it is not."""
    data = json.loads(text.decode("utf-8"), object_pairs_hook=_json_object)
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"a string holds a lone surrogate ({e.object[e.start:e.end]!r})") from None
    return data


def manifest_path(root: Path, arch: str) -> Path:
    return Path(root) / "manifests" / f"{arch}.json"


def read_manifest(root: Path | None = None, arch: str = "sm_90a") -> Manifest:
    """Read and structurally check ``manifests/<arch>.json`` under ``root``."""
    root = resolved_root(root)
    path = manifest_path(root, arch)
    fix = rebuild(arch, root)
    try:
        text = _read_regular_file(str(path), MANIFEST_MAX_BYTES + 1, inside=str(root))
    except FileNotFoundError:
        raise SchemaError("manifest not found.", file=path, fix=fix) from None
    except _OutsideRoot as e:
        raise _outside_root("manifest", e.real, root, arch, file=path) from None
    except NotADirectoryError:  # a root naming a file: no rebuild fixes that (the build refuses such an --out)
        raise PathError("a file stands where the cache root's folder or its manifests/ folder should be.", file=path,
                        fix=_POINT_AT_A_ROOT) from None
    except PermissionError as e:
        raise SchemaError(f"manifest cannot be read by this process ({e}).", file=path,
                          fix=_read_access(root)) from None
    except OSError as e:
        _raise_if_process_state(e, "manifest", path)
        raise SchemaError(f"manifest is not readable JSON ({e}).", file=path, fix=fix) from None
    return manifest_from_text(text, path, root, arch)


def manifest_from_text(text: bytes, path: Path, root: Path, arch: str, *, measurement_build_ok: bool = False
                       ) -> Manifest:
    """The checks of ``read_manifest`` on a manifest's bytes (``path``: where they are, or are about to be, written;
    the build runs this over each manifest before it writes one). ``measurement_build_ok``: a manifest recording
    measurement switches is taken (the build that writes one), as ``ALLOW_MEASUREMENT_BUILD_ENV`` lets a load."""
    fix = rebuild(arch, root)
    try:
        if len(text) > MANIFEST_MAX_BYTES:
            raise ValueError(f"over {MANIFEST_MAX_BYTES} bytes")
        data = _parse_manifest(text)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
        raise SchemaError(f"manifest is not readable JSON ({e}).", file=path, fix=fix) from None
    # type() first: JSON's true and 1.0 equal 1 in Python, and every other field is held to its exact type.
    if not isinstance(data, dict):  # a top-level array or string was named "unknown manifest schema 'list'"
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise SchemaError(f"manifest is {kind}, not a JSON object.", file=path, fix=fix)
    if type(data.get("schema")) is not int or data["schema"] != SCHEMA_VERSION:
        raise SchemaError(
            f"unknown manifest schema {data.get('schema')!r}; this runtime reads schema {SCHEMA_VERSION}.", file=path,
            fix=f"rebuild with this version: {fix}",
        )
    if data.get("arch") != arch:
        raise SchemaError(f"manifest is for arch {data.get('arch')!r}, expected {arch!r}.", file=path, fix=fix)
    if type(data.get("kernels")) is not list:
        raise SchemaError("manifest has no list of kernels.", file=path, fix=fix)
    # Printed by python -m runtime verify and the loader's messages: exact types here, not a crash there. Every build
    # writes both (the toolchain also says whether it was a measurement build): one without them was not a build's.
    missing = [f for f in ("toolchain", "source_hash") if f not in data]
    if missing:
        raise SchemaError(f"manifest lacks {', '.join(missing)}.", file=path, fix=fix)
    toolchain, source_hash = data["toolchain"], data["source_hash"]
    bad = [f for f, ok in (("toolchain", type(toolchain) is dict),
                           ("source_hash", type(source_hash) is str and _SHA256_HEX.fullmatch(source_hash))) if not ok]
    if bad:
        raise SchemaError(f"manifest fields {', '.join(bad)} have the wrong type (toolchain an object, source_hash "
                          f"a SHA-256 in 64 lowercase hex digits, as the build writes it).", file=path, fix=fix)
    if not measurement_build_ok:
        _refuse_a_measurement_build(toolchain, path, fix)
    kernels = {}
    for raw in data["kernels"]:
        entry = _entry(raw, path, fix)
        if entry.name in kernels:
            raise DuplicateKernelError("kernel name appears twice in the manifest.", file=path, kernel=entry.name,
                                       fix=fix)
        kernels[entry.name] = entry
    return Manifest(path, root, arch, toolchain, source_hash, kernels)


# Set to 1 by a measurement job that loads a cache built with its switches (gpu/jobs: the timeline builds).
ALLOW_MEASUREMENT_BUILD_ENV = "SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD"


def _refuse_a_measurement_build(toolchain: dict, path: Path, fix: str) -> None:
    """A MeasurementBuildError where the build recorded switches (build_kernels.py: the kernels' measurement switches
    and CuTe DSL's compile settings set while it compiled), unless a measurement asks for such a cache."""
    switches = toolchain.get("build_switches")
    if switches is None or os.environ.get(ALLOW_MEASUREMENT_BUILD_ENV) == "1":
        return
    shown = ", ".join(f"{k}={v}" for k, v in switches.items()) if type(switches) is dict else repr(switches)
    if not shown:  # no build records an empty set: a hand edit, said as such rather than "built with  set"
        shown = "an empty toolchain.build_switches (which no build writes)"
    raise MeasurementBuildError(
        f"the cache was built with {shown} set: a measurement build, whose kernels compute something else than the "
        f"ops (or were compiled otherwise than the committed build).", file=path,
        fix=f"unset them and rebuild: {fix} (a measurement that means to load it sets {ALLOW_MEASUREMENT_BUILD_ENV}=1)")


def _entry(raw, path: Path, fix: str) -> KernelEntry:
    name = raw.get("name") if isinstance(raw, dict) else None
    missing = [f for f in _ENTRY_FIELDS if not isinstance(raw, dict) or f not in raw]
    if missing:
        raise SchemaError(f"manifest entry lacks {', '.join(missing)}.", file=path, kernel=name, fix=fix)
    not_text = [f for f in ("name", "family", "symbol", "cubin", "sha256", "contract_hash") if type(raw[f]) is not str]
    if not_text:
        raise SchemaError(f"manifest entry fields {', '.join(not_text)} must be strings.", file=path, kernel=name,
                          fix=fix)
    # Exact JSON types and ranges (no coercion: "false" is not False, 5816.9 is not 5816): these
    # values become the launch configuration, which nothing else checks against the cubin.
    params, cluster = raw["params"], raw["cluster"]
    bad = [f for f in ("size", "threads", "smem_bytes") if type(raw[f]) is not int]
    bad += [f for f in ("pdl", "non_portable_cluster") if type(raw[f]) is not bool]
    bad += [] if type(raw["config"]) is dict else ["config"]
    # The cubin's and the contract's digests as hashlib writes them: a malformed field reads as a cubin "altered" or
    # a contract changed, where the manifest is what is wrong.
    bad += [f for f in ("sha256", "contract_hash") if not _SHA256_HEX.fullmatch(raw[f])]
    if type(cluster) is not list or len(cluster) != 3 or any(type(c) is not int or c < 1 for c in cluster):
        bad.append("cluster")
    if type(params) is not list or not all(
            type(p) is dict and type(p.get("name")) is str and type(p.get("ctype")) is str
            and type(p.get("offset")) is int and p["offset"] >= 0 and type(p.get("size")) is int
            and C_TYPE_SIZES.get(p["ctype"]) == p["size"] for p in params):
        bad.append("params")
    if not bad:
        bad += [f for f, ok in (("size", 0 < raw["size"] <= CUBIN_MAX_BYTES), ("threads", 0 < raw["threads"] <= 1024),
                                ("smem_bytes", raw["smem_bytes"] >= 0),
                                ("non_portable_cluster", raw["non_portable_cluster"] == (
                                    cluster[0] * cluster[1] * cluster[2] > 8))) if not ok]
    if bad:
        raise SchemaError(f"manifest entry fields {', '.join(bad)} have the wrong type or value.", file=path,
                          kernel=name, fix=fix)
    return KernelEntry(
        name=raw["name"], family=raw["family"], config=dict(raw["config"]), symbol=raw["symbol"],
        cubin=raw["cubin"], sha256=raw["sha256"], size=raw["size"], threads=raw["threads"], cluster=tuple(cluster),
        non_portable_cluster=raw["non_portable_cluster"], smem_bytes=raw["smem_bytes"], pdl=raw["pdl"],
        params=tuple([ParamEntry(p["name"], p["ctype"], p["offset"], p["size"]) for p in params]),
        contract_hash=raw["contract_hash"],
    )


# What the contract fixes of a kernel and the manifest repeats: the host ops pack arguments and compute grids from
# the contract, the loader configures launches from the manifest, so the two must agree.
CONTRACT_FIELDS = ("family", "config", "threads", "cluster", "non_portable_cluster", "smem_bytes", "pdl", "params")


def _contract_view(kernel) -> tuple:
    """CONTRACT_FIELDS of a contract Variant or a KernelEntry (the same names), comparable: config values with
    their types (JSON's 1 is not true, 2.0 not 2), parameters as (name, C type)."""
    return (kernel.family, {k: (type(v), v) for k, v in dict(kernel.config).items()}, kernel.threads,
            tuple(kernel.cluster), kernel.non_portable_cluster, kernel.smem_bytes, kernel.pdl,
            tuple([(p.name, p.ctype) for p in kernel.params]))


def _shown(kernel, field: str):
    if field == "config":
        return dict(kernel.config)
    if field == "params":
        return [f"{p.ctype} {p.name}" for p in kernel.params]
    return getattr(kernel, field)


def check_against_contract(manifest: Manifest) -> None:
    """Every entry equals the contract's variant of its name for the manifest's arch in CONTRACT_FIELDS.

    A manifest may hold a subset of the contract's kernels; an entry the contract does not know is refused, and so
    is one compiled against other contract sources than this runtime's (``contract_hash``), whose compiled-in
    constants may differ from those the host ops use although every field agrees.
    The contract is read once a call (the load path's cold start pays it once).
    """
    contract = {v.name: v for v in all_variants(manifest.arch)}
    fix = f"the cache was built from another contract than this runtime's; {rebuild(manifest.arch, manifest.root)}"
    for entry in manifest.kernels.values():
        variant = contract.get(entry.name)
        if variant is None:
            raise ContractMismatchError(f"this runtime's contract has no kernel of this name for {manifest.arch}.",
                                        file=manifest.path, kernel=entry.name, fix=fix)
        got, want = _contract_view(entry), _contract_view(variant)
        if got != want:
            fields = [f for f, g, w in zip(CONTRACT_FIELDS, got, want) if g != w]
            details = "; ".join(f"{f} {_shown(entry, f)!r}, contract {_shown(variant, f)!r}" for f in fields)
            raise ContractMismatchError(f"the entry differs from this runtime's contract in {', '.join(fields)} "
                                        f"({details}).", file=manifest.path, kernel=entry.name, fix=fix)
        ours = _contract_hash_or_refusal(entry.family, manifest.path)
        if entry.contract_hash != ours:
            raise ContractMismatchError(
                f"the kernel was compiled against other contract sources (runtime/contract/__init__.py and "
                f"{entry.family}.py: sha256 {entry.contract_hash[:12]!r}, this runtime's {ours[:12]!r}); a constant "
                f"it compiles in may differ from the one the host op uses.", file=manifest.path, kernel=entry.name,
                fix=fix)


def _contract_hash_or_refusal(family: str, path: Path) -> str:
    """``family_contract_hash``, or a refusal where this runtime ships without its contract's sources (.pyc only, a
    zipped package): the stamp cannot be compared, and an OSError would escape every op call instead of a fallback."""
    try:
        return family_contract_hash(family)
    except OSError as e:
        raise ContractMismatchError(f"this runtime's contract sources cannot be read to compare the entries' stamps "
                                    f"({e}).", file=path,
                                    fix="install the runtime with its sources (runtime/contract/*.py)") from None


# The build lock is opened as the build's filelock opens it: not through a symlink (filelock refuses one, so no build
# can hold it, and O_CREAT would make a dangling one's target outside the root), and without blocking where it is a
# FIFO (the open would wait for a writer forever; a FIFO's flock works as a regular file's).
_LOCK_OPEN_FLAGS = (os.O_RDONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
                    | getattr(os, "O_NOFOLLOW", 0))


# Errors of the process's state at the time, not of the cache: out of file descriptors (the process's or the
# system's) or of kernel memory. Taken for a refusal, they would send every later call to the fallback for good.
_PROCESS_STATE_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM))


def _raise_if_process_state(error: OSError, what: str, path: Path) -> None:
    """CacheLoadInterrupted where reading ``what`` failed for the process's state (``_PROCESS_STATE_ERRNOS``)."""
    if error.errno in _PROCESS_STATE_ERRNOS:
        raise CacheLoadInterrupted(f"the process could not open or read the {what} ({error}).", file=path,
                                   fix="free file descriptors or memory; the next call loads again") from None


@contextlib.contextmanager
def build_settled(root: Path, wait_s: float = BUILD_WAIT_S):
    """Hold the cache root's build lock shared while the caller reads the manifest and its cubins.

    A build rewrites changed cubins before the manifest that names them, each file atomically but not the cache as
    a whole: a load in between would find sha256 mismatches and refuse the arch for good. The build holds the lock
    exclusively while it writes (``build_kernels.write_cache``), so a load waits for the writes to end instead;
    loads share it and do not wait for each other. The lock file is created where it is missing (a checkout not yet
    built in place), so a first build cannot start unseen; a root where it cannot be created (read-only installed
    data files) is read unguarded, as it is without flock (Windows; a filesystem without it, where filelock falls
    back to a marker file this does not see). A build still writing after ``wait_s`` raises CacheLoadInterrupted
    (not a refusal: the next call loads again).
    """
    lock = os.path.join(str(root), BUILD_LOCK)
    try:
        fd = None if fcntl is None else os.open(lock, _LOCK_OPEN_FLAGS, 0o666)
    except OSError as e:  # read-only root, no permission, no such directory (read_manifest names the latter), a symlink
        _raise_if_process_state(e, "build lock", Path(lock))
        fd = None
    if fd is None:
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CacheLoadInterrupted(
                        f"a build has been writing this cache for over {wait_s:.0f} s.",
                        file=lock,
                        fix="load again once the build is done (build into another --out and point "
                            f"{CACHE_ROOT_ENV} at it to serve during a build)") from None
                time.sleep(0.005)
            except OSError:  # no flock on this filesystem (filelock then uses a marker file): read unguarded
                break
        yield
    finally:
        os.close(fd)  # releases the lock


def _cubin_path(manifest: Manifest, entry: KernelEntry) -> str:
    """The cubin's path as a string, refusing any that leaves the cache root or names another kernel's file.

    A lexical check on the string (no filesystem walk, no pathlib objects on the load path);
    the sha256 pins the content. ``..`` anywhere, an absolute path, a backslash or an empty
    path is refused, as ``PurePosixPath`` would read them.
    """
    rel = entry.cubin
    parts = [p for p in rel.split("/") if p and p != "."]
    if not parts or ".." in parts or rel.startswith("/") or "\\" in rel:
        raise PathError(
            f"cubin path {rel!r} leaves the cache root {manifest.root}.", file=manifest.path, kernel=entry.name,
            fix=f"paths are relative to the cache root; {rebuild(manifest.arch, manifest.root)}",
        )
    if parts[-1] != f"{entry.name}.cubin":
        # Variants share symbols and parameter layouts (sinks on and off, cluster sizes): an entry naming another
        # variant's cubin, with that file's size and sha256, would pass every other check and launch the wrong math.
        raise PathError(f"cubin path {rel!r} is not the kernel's own file ({entry.name}.cubin).", file=manifest.path,
                        kernel=entry.name, fix=rebuild(manifest.arch, manifest.root))
    return os.path.join(str(manifest.root), rel)  # root resolved by read_manifest


def cubin_file(manifest: Manifest, entry: KernelEntry) -> Path:
    """The cubin's path, refusing any that leaves the cache root or names another kernel's file."""
    return Path(_cubin_path(manifest, entry))


def no_tick(label: str) -> None:
    """The default ``tick`` of the load path: no phase profile."""


def read_checked_cubin(manifest: Manifest, entry: KernelEntry, *, sections: bool = True, tick=no_tick) -> bytes:
    """The cubin's bytes once its path, size, sha256, ELF arch, symbol and params check out.

    ``sections=False`` (``runtime.load()``) parses only what the driver would read unchecked: the section and
    program headers, every attribute list's records, and the kernel's own list (the symbol, the parameter count and
    the block shape against the manifest); the parameter layout is then the driver's check (``cuFuncGetParamInfo``),
    which is what it trusts at launch. ``sections=True`` (``check_cache``) parses every kernel's parameter layout
    too. ``tick(label)`` is called after each step (the loader's phase profile).
    """
    path = _cubin_path(manifest, entry)
    try:
        # Bounded by the entry's size (a huge file is refused below); only a file really inside the root.
        data = _read_regular_file(path, entry.size + 1, inside=str(manifest.root))
    except FileNotFoundError:
        raise MissingCubinError("cubin is missing.", file=Path(path), kernel=entry.name,
                                fix=rebuild(manifest.arch, manifest.root)) from None
    except _OutsideRoot as e:
        raise _outside_root("cubin", e.real, manifest.root, manifest.arch, file=Path(path),
                            kernel=entry.name) from None
    except PermissionError as e:
        raise CubinIntegrityError(f"cubin cannot be read by this process ({e}).", file=Path(path), kernel=entry.name,
                                  fix=_read_access(manifest.root)) from None
    except (OSError, ValueError) as e:  # a directory, a FIFO or device, a NUL in the path
        if isinstance(e, OSError):
            _raise_if_process_state(e, "cubin", Path(path))
        raise CubinIntegrityError(f"cubin is not a readable file ({e}).", file=Path(path), kernel=entry.name,
                                  fix=rebuild(manifest.arch, manifest.root)) from None
    tick("cubin_read")
    if len(data) != entry.size:
        got = f"more than {entry.size}" if len(data) > entry.size else len(data)
        raise CubinIntegrityError(
            f"cubin has {got} bytes, the manifest says {entry.size} (truncated or replaced).",
            file=Path(path), kernel=entry.name, fix=rebuild(manifest.arch, manifest.root),
        )
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CubinIntegrityError("cubin sha256 does not match the manifest (altered).", file=Path(path),
                                  kernel=entry.name, fix=rebuild(manifest.arch, manifest.root))
    tick("cubin_sha256")
    if sections:
        check_cubin_against_entry(data, entry, Path(path), manifest.arch, manifest.root)
    else:
        check_cubin_arch(data, entry, path, manifest.arch, manifest.root)
    # The loader hands these bytes to the driver next, which does not bounds-check a crafted section table (seen: a
    # hang, a segfault) and is not trusted to with the attribute lists it reads either. In check_cache too (its own
    # parse reads the kernels' lists, not the global one), so that no cubin it passes is refused at load.
    try:
        attributes = check_section_table(data, kernel=None if sections else entry.symbol)
    except CubinFormatError as e:
        raise _unreadable_elf(e, entry, path, manifest.arch, manifest.root) from None
    if not sections:  # the entry's own list, parsed above (check_cubin_against_entry checked it on the other path)
        _check_attributes(attributes, entry, path, manifest.arch, manifest.root)
    tick("cubin_elf")
    return data


class _OutsideRoot(Exception):
    """The opened file really lies outside the cache root: a symlink inside the root led out of it."""

    def __init__(self, real: str):
        super().__init__(real)
        self.real = real


def _read_regular_file(path: str, limit: int, inside: str | None = None) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``; with ``inside`` (a resolved cache root), only where
    the file opened really lies under it (else _OutsideRoot).

    Opened non-blocking and checked with fstat before any read: the path (or a symlink's target, which the
    lexical root check does not follow) naming a FIFO, a socket or a device would otherwise block the load
    or read an endless stream. O_NONBLOCK changes nothing for a regular file.
    """
    if inside is not None and _O_PATH:  # where it leads, before a FIFO or device outside the root is opened
        pfd = os.open(path, _O_PATH | getattr(os, "O_CLOEXEC", 0))
        try:
            _require_inside(pfd, path, inside)
        finally:
            os.close(pfd)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if inside is not None:  # again, about the file actually opened (a link swapped since)
            _require_inside(fd, path, inside)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks = []
        while limit > 0:  # os.read without a buffered file object: a few us less a cubin on the load path
            chunk = os.read(fd, limit)
            if not chunk:
                break
            chunks.append(chunk)
            limit -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


_O_PATH = getattr(os, "O_PATH", 0)  # Linux: opens no device, FIFO or file, only names it


def _real_path(fd: int, path: str) -> str:
    """Where the open file ``fd`` really lies: the kernel's answer on Linux (one readlink, about the file actually
    opened, so a link swapped after the check cannot pass), else ``path`` resolved link by link."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (not Linux, or not mounted)
        return os.path.realpath(path)


def _require_inside(fd: int, path: str, root: str) -> None:
    """The root is the trust boundary: its build lock covers only files inside it, so a file reached through a
    symlink out of it (or a linked cubins/ folder) may be another cache's, rewritten under another lock."""
    real = _real_path(fd, path)
    if not real.startswith(root.rstrip(os.sep) + os.sep):
        raise _OutsideRoot(real)


def _outside_root(what: str, real: str, root, arch: str, **where) -> PathError:
    return PathError(
        f"{what} resolves to {real}, outside the cache root {root} (a symbolic link leads out of it; the cache's "
        f"checks and its build lock cover the root only).", **where,
        fix=f"put the file itself in the cache root in place of the link (cp -L), or point ${CACHE_ROOT_ENV} at a "
            f"root that holds its own files ({REBUILD.format(arch=arch)} --out <root>)",
    )


def _unreadable_elf(e: CubinFormatError, entry: KernelEntry, path, arch: str, root=None) -> CubinIntegrityError:
    return CubinIntegrityError(f"cubin is not a readable CUDA ELF ({e}).", file=Path(path), kernel=entry.name,
                               fix=rebuild(arch, root))


def check_cubin_arch(data: bytes, entry: KernelEntry, path, arch: str, root=None):
    """The ELF header's SM must be the manifest's arch; returns the parsed header."""
    try:
        info = read_header(data)
    except CubinFormatError as e:
        raise _unreadable_elf(e, entry, path, arch, root) from None
    if not info.arch_matches(arch):
        raise CubinArchError(
            f"cubin targets {info.arch}, the manifest says {arch}.", file=Path(path), kernel=entry.name,
            fix=f"use the cubin built for {arch}: {rebuild(arch, root)}",
        )
    return info


def _check_attributes(attributes: KernelAttributes | None, entry: KernelEntry, path, arch: str, root=None) -> None:
    """The manifest lists as many parameters as the ELF's attribute list of the kernel has (``attributes``, as
    kernel_attributes parsed them; None: the cubin has no list of its symbol), and its threads are the block shape the
    kernel was compiled for (where the list names one).

    The loader's one ELF read past the header: ``cuFuncGetParamInfo`` is asked for the manifest's
    parameters only, so a kernel with more parameters than the manifest lists needs this.
    """
    if attributes is None:
        raise SymbolError(f"cubin has no kernel symbol {entry.symbol!r}.", file=Path(path), kernel=entry.name,
                          fix=rebuild(arch, root))
    if attributes.param_count != len(entry.params):
        raise ParamLayoutError(
            f"the manifest lists {len(entry.params)} parameters, the cubin's ELF has {attributes.param_count}.",
            file=Path(path), kernel=entry.name,
            fix=f"the contract and the kernel disagree; {rebuild(arch, root)}",
        )
    check_block_shape(attributes.required_block, entry, path, arch, root)


def check_block_shape(required: tuple | None, entry: KernelEntry, path, arch: str, root=None) -> None:
    """The block shape the kernel was compiled for (EIATTR_REQNTID; None where it names none) is the manifest's
    threads, the shape every launch uses: the driver refuses a launch of another, so it is refused at load instead."""
    if required is not None and required != (entry.threads, 1, 1):
        raise BlockShapeError(
            f"the cubin's kernel requires blocks of {list(required)} threads, the manifest launches "
            f"[{entry.threads}, 1, 1].", file=Path(path), kernel=entry.name,
            fix=f"the contract and the kernel disagree; {rebuild(arch, root)}",
        )


def check_cubin_against_entry(data: bytes, entry: KernelEntry, path, arch: str, root=None) -> None:
    """ELF-level checks: the SM, the symbol (its attribute list and its symbol table entry), the required block shape,
    and each parameter's offset and size (in the capmerc image's list too, where the cubin has one)."""
    fix = rebuild(arch, root)
    check_cubin_arch(data, entry, path, arch, root)
    try:
        info = read_cubin(data)
        # Before the symbol is looked up in read_cubin's .nv.info lists: a capmerc list of the kernel without its
        # .nv.info list is the two images disagreeing (unreadable ELF), as the load's check_section_table says.
        attributes = kernel_attributes(data, entry.symbol)
        symbols = symbol_table_entries(data, entry.symbol)
    except CubinFormatError as e:
        raise _unreadable_elf(e, entry, path, arch, root) from None
    if entry.symbol not in info.kernels:
        raise SymbolError(f"cubin has no kernel symbol {entry.symbol!r}.", file=path, kernel=entry.name, fix=fix)
    check_symbol_table_entry(symbols, entry, path, arch, root)
    sass = info.kernels[entry.symbol]
    check_param_layout(entry, [(p.offset, p.size) for p in sass], path, arch, "the cubin's ELF", root)
    check_capmerc_layout(entry, sass, info.capmerc.get(entry.symbol), path, arch, root)
    _check_attributes(attributes, entry, path, arch, root)  # the count agrees with the layout just checked: block shape


def check_symbol_table_entry(symbols, entry: KernelEntry, path, arch: str, root=None) -> None:
    """The cubin's symbol table defines the kernel's symbol once, as a global or weak function in a section of the
    ELF (``symbols``: its entries of that name, as symbol_table_entries read them; None: the ELF has no symbol table).

    The driver looks the kernel up by name there, where every other check finds it by its attribute list's section
    name (.nv.info.<symbol>): a cubin with that list and no such entry passed them all, left to the driver's lookup
    at load to refuse. Every committed kernel's entry is a global function (STB_GLOBAL, STT_FUNC) in its
    .text.<symbol> section.
    """
    where = "the cubin's symbol table (.symtab)"
    fix = rebuild(arch, root)
    if not symbols:
        said = "the cubin has no symbol table (.symtab)" if symbols is None else f"{where} has no entry named it"
        raise SymbolError(f"{said}: the driver finds kernel symbol {entry.symbol!r} by name there.", file=path,
                          kernel=entry.name, fix=fix)
    if len(symbols) > 1:  # which of them the driver's lookup by name would take is its own affair
        raise SymbolError(f"{where} has {len(symbols)} entries named {entry.symbol!r}, a kernel symbol has one.",
                          file=path, kernel=entry.name, fix=fix)
    (symbol,) = symbols
    if symbol.type != STT_FUNC or symbol.binding not in (STB_GLOBAL, STB_WEAK) or not symbol.defined:
        raise SymbolError(
            f"{where} has {entry.symbol!r} as binding {symbol.binding}, type {symbol.type} in section "
            f"{symbol.section}{'' if symbol.defined else ' (none of the ELF)'}, not as a global or weak function "
            f"(binding {STB_GLOBAL} or {STB_WEAK}, type {STT_FUNC}) defined in a section of the ELF.", file=path,
            kernel=entry.name, fix=fix)


def check_capmerc_layout(entry: KernelEntry, sass, merc, path, arch: str, root=None) -> None:
    """Each parameter of the kernel's capmerc attribute list (``merc``: .nv.merc.nv.info.<symbol> of an sm_100a cubin,
    None where it has none) has the ordinal, offset and size of the .nv.info list's (``sass``, checked against the
    manifest just before). The driver may build the kernel it runs from the capmerc image (its finalizer), and the
    load compares only the two lists' parameter counts and block shapes (check_section_table, kept to what is cheap):
    a parameter at another offset there passed every check."""
    if merc is None:
        return
    if len(merc) != len(sass):  # the load's check_section_table refuses this first (kernel_attributes)
        raise ParamLayoutError(f"the capmerc attribute list (.nv.merc.nv.info) of kernel symbol {entry.symbol!r} lists "
                               f"{len(merc)} parameters, its .nv.info list {len(sass)}.", file=path,
                               kernel=entry.name, fix=f"the two images of the kernel disagree; {rebuild(arch, root)}")
    for i, (ours, theirs) in enumerate(zip(sass, merc)):
        if ours != theirs:
            name = entry.params[i].name if i < len(entry.params) else "?"
            raise ParamLayoutError(
                f"the capmerc attribute list (.nv.merc.nv.info) of kernel symbol {entry.symbol!r} gives parameter {i} "
                f"({name}) (ordinal, offset, size) {tuple(theirs)}, its .nv.info list {tuple(ours)} (the manifest's "
                f"offset and size).", file=path, kernel=entry.name,
                fix=f"the two images of the kernel disagree; {rebuild(arch, root)}")


def check_param_layout(entry: KernelEntry, actual, path, arch: str, source: str, root=None) -> None:
    """Compare the manifest's (offset, size) list with ``actual`` from ``source``."""
    expected = [(p.offset, p.size) for p in entry.params]
    actual = list(actual)
    if actual != expected:
        # A crafted list may hold a quarter of a million records: the message shows what a kernel could have.
        shown = str(actual) if len(actual) <= 2 * len(expected) + 8 else f"{len(actual)} parameters, {actual[:8]} ..."
        raise ParamLayoutError(
            f"parameters (offset, size) {expected} contradict {source}: {shown}.", file=path,
            kernel=entry.name, fix=f"the contract and the kernel disagree; {rebuild(arch, root)}",
        )


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def supported_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    return arch


def unnamed_files(root: Path, arch: str, cubins) -> list[Path]:
    """What ``root/cubins/<arch>/`` holds that none of ``cubins`` (the manifest entries' cubin paths, relative to the
    root) names (the cubin of a variant the sources no longer define, or a killed build's staged copy), and a killed
    build's staged copies of the arch's manifest (``manifests/.<arch>.json.*``, the build's staged names). No load
    reads them, but a plain install would ship them, and a cache that holds more than its manifest says cannot be
    told from one that lost a manifest entry. A build removes them, its --check fails them, ``verify --files-only``
    names them."""
    path = manifest_path(root, arch)
    staged_manifests = sorted(path.parent.glob(f".{path.name}.*"))
    folder = Path(root) / "cubins" / arch
    if not folder.is_dir():
        return staged_manifests
    # Compared as normalised paths, not through the filesystem (a stray file may be a dangling or looping link): the
    # runtime reads "cubins/sm_90a/./x.cubin" as "cubins/sm_90a/x.cubin".
    named = {os.path.normpath(cubin) for cubin in cubins}
    unnamed = sorted(p for p in folder.iterdir() if os.path.normpath(f"cubins/{arch}/{p.name}") not in named)
    return unnamed + staged_manifests


def check_cache(root: Path | None = None, arch: str = "sm_90a") -> Manifest:
    """Every CPU-side check of a cache (no GPU needed): the manifest, its entries against the contract, then each
    cubin, with no build's writes in between (``build_settled``)."""
    root = resolved_root(root)
    with build_settled(root):
        manifest = read_manifest(root, arch)
        check_against_contract(manifest)
        for entry in manifest.kernels.values():
            read_checked_cubin(manifest, entry)
    return manifest
