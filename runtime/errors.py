"""Typed errors of the kernel cache (each names the file, the kernel and the fix), and the runtime's warnings."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings

REBUILD_ALL = "python build_kernels.py"
REBUILD = REBUILD_ALL + " --arch {arch}"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames a call passes through on its way into the runtime and that name no line of the caller's:
# dataclasses.replace and the __init__ a dataclass generates (exec'd, so its file is "<string>").
_DATACLASSES_FILE = os.path.abspath(dataclasses.__file__)
# build_kernels.py's default --out, resolved once (rebuild() runs on the load path: every load reads a manifest)
_CHECKOUT = os.path.realpath(os.path.dirname(os.path.dirname(_PACKAGE_DIR)))


def rebuild(arch: str | None, root=None) -> str:
    """REBUILD for ``arch`` (None: every arch), with ``--out root`` where the cache root is not the build's default
    (this checkout)."""
    fix = REBUILD.format(arch=arch) if arch else REBUILD_ALL
    if root is not None and os.path.realpath(root) != _CHECKOUT:
        fix += f" --out {shell_word(root)}"
    return fix


def shell_word(path) -> str:
    """``path`` as one word of a shell command in a fix: a root with a space or a ';' in it, written bare, split the
    command pasted (the rebuild's argparse refused the rest, a chmod changed other folders). Quoted only then."""
    import shlex  # only a fix that names another root than the checkout's needs it

    return shlex.quote(str(path))


def escape_unencodable_output() -> None:
    """The command lines' standard output and error print what they cannot encode escaped: a path whose name is no
    UTF-8 (Python keeps its bytes as surrogates) raised UnicodeEncodeError under a strict UTF-8 locale, a traceback
    in the middle of the work (after one arch was written or checked, before the next)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _inside_runtime(filename: str) -> bool:
    if filename == "<string>":
        return True
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE_DIR) or path == _DATACLASSES_FILE


def warn_at_caller(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """Warn at the first frame outside this package: the warning names the line of the caller's code however deep
    in the runtime it was raised (a host op called by the indexer, a state built by dataclasses.replace), so a
    warnings filter by module and Python's once-per-line default both act on the caller's line."""
    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and _inside_runtime(frame.f_code.co_filename):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)


class _LocatedError(RuntimeError):
    """An error whose message names the file, the kernel, the problem and the fix."""

    def __init__(self, problem: str, *, file=None, kernel=None, fix=None):
        self.problem, self.file, self.kernel, self.fix = problem, file, kernel, fix
        where = " ".join(x for x in (f"{file}:" if file else "", f"kernel {kernel}:" if kernel else "") if x)
        text = f"{where} {problem}".strip()
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)


class CacheError(_LocatedError):
    """Base of every refusal to load or launch from the kernel cache."""


class CacheLoadInterrupted(_LocatedError):
    """A load stopped by the process's state at the time (out of GPU memory, CUDA graph stream capture, a sticky
    error from an earlier kernel's fault), not by the cache: not a CacheError, so the host ops raise it instead of
    remembering a refusal, and a later call loads again."""


class NoDriverError(CacheError):
    """No usable CUDA driver or device in this process."""


class SchemaError(CacheError):
    """The manifest is missing, not JSON, of an unknown schema, or malformed."""


class PathError(CacheError):
    """A cubin path points outside the cache root, or a cache file resolves outside it (a symlink leads out)."""


class MeasurementBuildError(CacheError):
    """The cache was built with measurement switches or CuTe DSL compile settings set (the manifest's
    ``toolchain.build_switches``): its kernels compute something else than the ops (timing marks written over an
    input, a product left out) or were compiled otherwise than the committed build."""


class DuplicateKernelError(CacheError):
    """Two manifest entries share a kernel name."""


class MissingCubinError(CacheError):
    """A cubin named by the manifest is absent."""


class CubinIntegrityError(CacheError):
    """A cubin's size or sha256 differs from the manifest (truncated or altered)."""


class CubinArchError(CacheError):
    """The cubin's ELF header names another SM than the manifest's arch."""


class ContractMismatchError(CacheError):
    """A manifest entry differs from this runtime's contract (runtime/contract), from which the host ops pack the
    arguments and compute the grids, or names a kernel the contract does not know."""


class DriverRefusedError(CacheError):
    """The driver refused to load or configure a cubin (e.g. a driver older than the build's toolchain), or lacks a
    function the loader calls."""


class DeviceArchError(CacheError):
    """The manifest's arch cannot run on this device."""


class SymbolError(CacheError):
    """The cubin lacks the kernel symbol the manifest names."""


class ParamLayoutError(CacheError):
    """The manifest's parameter list contradicts the binary's."""


class BlockShapeError(CacheError):
    """The cubin was compiled for another thread-block shape than the manifest's threads (its EIATTR_REQNTID): the
    driver would refuse every launch."""


class SharedMemoryError(CacheError):
    """The kernel asks for more shared memory than the device allows."""


class ClusterShapeError(CacheError):
    """The device cannot launch the kernel's cluster shape."""


class UnknownKernelError(CacheError, KeyError):
    """No kernel of that name in the loaded cache."""

    __str__ = RuntimeError.__str__
