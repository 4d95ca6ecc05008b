"""Crafted copies of the committed cache for the loader's refusal tests (CPU and GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runtime.manifest import manifest_path

REPO = Path(__file__).resolve().parent.parent


def copy_probe_cache(root: Path, archs=("sm_90a", "sm_100a")) -> Path:
    """The committed probe kernels of ``archs`` (cubins and manifests) under ``root``."""
    for arch in archs:
        data = json.loads(manifest_path(REPO, arch).read_text())
        data["kernels"] = [k for k in data["kernels"] if k["family"] == "probe"]
        for k in data["kernels"]:
            dst = root / k["cubin"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / k["cubin"], dst)
        target = manifest_path(root, arch)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data))
    return root


def edit_manifest(root, arch, fn):
    path = manifest_path(root, arch)
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def first_cubin(root, arch="sm_90a") -> Path:
    data = json.loads(manifest_path(root, arch).read_text())
    return root / data["kernels"][0]["cubin"]


def drop_last_param(data) -> None:
    """The first kernel's manifest entry lists one parameter fewer than its cubin has."""
    data["kernels"][0]["params"].pop()


def shift_second_param(data) -> None:
    """The first kernel's second parameter at another offset than the cubin's."""
    data["kernels"][0]["params"][1]["offset"] = 12


def add_param(data) -> None:
    """The first kernel's manifest entry lists a parameter its cubin lacks."""
    data["kernels"][0]["params"].append({"name": "x", "ctype": "int32_t", "offset": 12, "size": 4})
