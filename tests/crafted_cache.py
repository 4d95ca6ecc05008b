"""Crafted copies of the committed cache for the loader's refusal tests (CPU and GPU)."""

from __future__ import annotations

import hashlib
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


def rewrite_first_cubin(root, arch, fn) -> None:
    """Edit the first cubin's bytes in place (``fn`` of a bytearray) and rewrite its manifest size and sha256 to match:
    a crafted cubin that passes the integrity checks, for the checks behind them."""
    f = first_cubin(root, arch)
    data = bytearray(f.read_bytes())
    fn(data)
    f.write_bytes(bytes(data))
    edit_manifest(root, arch, lambda d: d["kernels"][0].update(size=len(data), sha256=hashlib.sha256(data).hexdigest()))


def sass_list_renamed(symbol: str):
    """An edit of a cubin's bytes (for ``rewrite_first_cubin``): kernel ``symbol``'s .nv.info list is named for another
    symbol (its first letter's case flipped), its capmerc list (.nv.merc.nv.info.<symbol>, sm_100a) kept."""
    def edit(data):
        from runtime.cubin import _section_heads

        heads, shstrndx = _section_heads(bytes(data))
        strtab = heads[shstrndx][4]
        name = b".nv.info." + symbol.encode() + b"\0"
        (head,) = [h for h in heads if bytes(data[strtab + h[0] :]).startswith(name)]
        data[strtab + head[0] + len(b".nv.info.")] ^= 0x20
    return edit

def drop_last_param(data) -> None:
    """The first kernel's manifest entry lists one parameter fewer than its cubin has."""
    data["kernels"][0]["params"].pop()


def shift_second_param(data) -> None:
    """The first kernel's second parameter at another offset than the cubin's."""
    data["kernels"][0]["params"][1]["offset"] = 12


def add_param(data) -> None:
    """The first kernel's manifest entry lists a parameter its cubin lacks."""
    data["kernels"][0]["params"].append({"name": "x", "ctype": "int32_t", "offset": 12, "size": 4})


def contract_follows_the_manifest(monkeypatch, root, arch="sm_90a") -> None:
    """Make the runtime's contract list each probe kernel's parameters as the (crafted) manifest at ``root`` does: the
    loader checks the manifest against the contract first, so a test of the binary's checks (a cubin whose parameters
    differ from both) needs the two to agree."""
    import dataclasses

    import runtime.contract.probe as probe
    from runtime.contract import Param

    entries = {k["name"]: k for k in json.loads(manifest_path(root, arch).read_text())["kernels"]}

    def following(variant):
        if variant.name not in entries:
            return variant
        return dataclasses.replace(variant, params=tuple(Param(p["name"], p["ctype"])
                                                         for p in entries[variant.name]["params"]))

    monkeypatch.setattr(probe, "VARIANTS", tuple(following(v) for v in probe.VARIANTS))
