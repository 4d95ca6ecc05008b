"""SASS of a committed cubin, for structural checks (sm_100a cannot run here; its cubins are
verified by what they contain). cuobjdump and nvdisasm come from the `test` extra's wheels."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path


def _tool_dir() -> str | None:
    try:
        import nvidia.cu13

        d = Path(nvidia.cu13.__path__[0]) / "bin"
        return str(d) if (d / "cuobjdump").exists() else None
    except ImportError:
        return None


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    d = _tool_dir()
    return os.path.join(d, "cuobjdump") if d else None


@cache
def sass(cubin: str) -> str:
    tool = cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump is not installed: pip install -e '.[test]'")
    env = dict(os.environ)
    d = _tool_dir()
    if d:
        env["PATH"] = d + os.pathsep + env.get("PATH", "")  # cuobjdump calls nvdisasm
    out = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, env=env, timeout=120, check=False)
    if out.returncode or "Function" not in out.stdout:
        raise RuntimeError(f"cuobjdump -sass {cubin} failed: {out.stderr}")
    return out.stdout


def opcode_sequence(cubin: str) -> list[str]:
    """The instruction mnemonics (with modifiers) of a cubin, in text order."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass(cubin))


def opcodes(cubin: str) -> set[str]:
    """The distinct instruction mnemonics (with modifiers) of a cubin."""
    return set(opcode_sequence(cubin))


@cache
def resource_usage(cubin: str) -> dict:
    """``cuobjdump -res-usage`` of a one-kernel cubin: {"REG": registers a thread, "SHARED": static shared bytes,
    "STACK", "LOCAL"}."""
    tool = cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump is not installed: pip install -e '.[test]'")
    out = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True, timeout=120, check=False)
    found = re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out.stdout)
    if out.returncode or not found:
        raise RuntimeError(f"cuobjdump -res-usage {cubin} failed: {out.stderr}")
    return {name: int(value) for name, value in found}
