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


def _cuobjdump(flag: str, cubin: str, expected: str) -> str:
    """``cuobjdump <flag> <cubin>``'s output, or a RuntimeError where it fails or lacks ``expected``."""
    tool = cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump is not installed: pip install -e '.[test]'")
    env = dict(os.environ)
    d = _tool_dir()
    if d:
        env["PATH"] = d + os.pathsep + env.get("PATH", "")  # cuobjdump calls nvdisasm
    out = subprocess.run([tool, flag, cubin], capture_output=True, text=True, env=env, timeout=120, check=False)
    if out.returncode or expected not in out.stdout:
        raise RuntimeError(f"cuobjdump {flag} {cubin} failed: {out.stderr}")
    return out.stdout


@cache
def sass(cubin: str) -> str:
    return _cuobjdump("-sass", cubin, "Function")


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
    found = re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", _cuobjdump("-res-usage", cubin, "REG:"))
    return {name: int(value) for name, value in found}
