"""The contract between the build side (``kernels/``) and the serve side (``runtime/``).

Each kernel family describes its variants here, once: the kernel's ordered
parameters and their C types, threads per block, cluster shape, dynamic shared
memory and whether it is launched with programmatic dependent launch. The build
compiles exactly these variants and checks the cubin against them; the runtime
loads them by name and packs arguments in this order. Pure Python, no torch and
no CuTe DSL, so both sides can import it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1

# Target architectures and the compute capability a device needs to run each.
ARCH_CAPABILITY = {"sm_90a": (9, 0), "sm_100a": (10, 0)}
ARCHS = tuple(ARCH_CAPABILITY)

# C types a kernel parameter may have, with their size in bytes.
C_TYPE_SIZES = {"void*": 8, "int32_t": 4, "uint32_t": 4, "float": 4, "int64_t": 8}

# Families in build order; each is a module of this package defining VARIANTS.
FAMILIES = ("probe", "empty", "sparse_mla_decode", "decode_topk", "topk_pool_rows")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and C type (a key of C_TYPE_SIZES)."""

    name: str
    ctype: str

    @property
    def size(self) -> int:
        return C_TYPE_SIZES[self.ctype]


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: a family at fixed compile-time parameters."""

    family: str
    name: str  # unique across families; the cubin's file stem and the lookup key
    params: tuple[Param, ...]
    threads: int
    cluster: tuple[int, int, int] = (1, 1, 1)
    smem_bytes: int = 0  # dynamic shared memory per CTA
    pdl: bool = False  # launched with programmatic stream serialization
    config: tuple[tuple[str, object], ...] = field(default=())  # e.g. (("width", 640),)
    archs: tuple[str, ...] = ARCHS

    @property
    def cluster_size(self) -> int:
        x, y, z = self.cluster
        return x * y * z

    @property
    def non_portable_cluster(self) -> bool:
        # Clusters above 8 CTAs need the non-portable-size attribute.
        return self.cluster_size > 8

    def option(self, key: str):
        return dict(self.config)[key]


def params(*spec: str) -> tuple[Param, ...]:
    """Parameters from "ctype name" strings: params("void* out", "int32_t n")."""
    out = []
    for item in spec:
        ctype, name = item.rsplit(" ", 1)
        if ctype not in C_TYPE_SIZES:
            raise ValueError(f"unknown C type {ctype!r} for parameter {name!r}")
        out.append(Param(name, ctype))
    return tuple(out)


def family_variants(family: str) -> tuple[Variant, ...]:
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{family}").VARIANTS


@functools.cache
def family_contract_hash(family: str) -> str:
    """sha256 of the contract sources a family's kernels are compiled against: this module (the types, the C type
    sizes) and the family's own (its constants). The build stamps every manifest entry with it and a load refuses an
    entry stamped otherwise: the kernels compile in constants that the host ops use too (a finite -inf, the heads,
    a row bound), and such a constant can change with no field the manifest repeats changing. Read once a process."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
    h = hashlib.sha256()
    for path in (Path(__file__), Path(__file__).with_name(f"{family}.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def all_variants(arch: str | None = None, families=None) -> list[Variant]:
    """Every registered variant, in build order, optionally for one arch/families."""
    out = []
    for family in families or FAMILIES:
        for v in family_variants(family):
            if arch is None or arch in v.archs:
                out.append(v)
    names = [v.name for v in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate kernel names in the contract: {dupes}")
    return out
