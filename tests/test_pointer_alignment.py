"""Each kernel's pointer alignment, one definition (the family contract's POINTER_ALIGN) held to both sides.

A cubin may assume no more alignment of a pointer than its host op guarantees: the compiler is told the alignment at
compile (the PTX parameter's ``.align``, the symbol's ``gmemalign<N>``) and may vectorize accesses on it, so a promise
above the host's check faults on an input the host accepts once a code change lets it. Until the seventy-eighth
session decode_topk's cubins declared 16 bytes for ``row_ends`` and ``out``, which the host checks for 4.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from odd_tensors import at_byte_offset

from runtime import contract as contracts
from runtime import topk
from runtime.indexer import topk_pool_rows
from runtime.manifest import manifest_path
from runtime.sparse_mla import sparse_mla_decode

REPO = Path(__file__).resolve().parents[1]
FP8 = torch.float8_e4m3fn
I32 = torch.int32
FAMILIES_WITH_POINTERS = ("probe", "sparse_mla_decode", "decode_topk", "topk_pool_rows")


def _contract(family):
    return importlib.import_module(f"runtime.contract.{family}")


def _pointer_names(family) -> list[str]:
    return [p.name for p in _contract(family).VARIANTS[0].params if p.ctype == "void*"]


def test_every_pointer_of_every_family_has_one_alignment():
    for family in contracts.FAMILIES:
        pointers = _pointer_names(family)
        aligns = getattr(_contract(family), "POINTER_ALIGN", {})
        assert list(aligns) == pointers, family  # in parameter order, none missing, none extra
        assert all(a in (1, 2, 4, 8, 16) for a in aligns.values()), family
    assert [f for f in contracts.FAMILIES if _pointer_names(f)] == list(FAMILIES_WITH_POINTERS)


def test_what_the_kernels_move_in_16_byte_vectors_is_16_byte_aligned():
    """A floor the contracts may not go under (the other tests take their numbers from POINTER_ALIGN): sparse MLA's
    queries, pools and output move in 16-byte copies and stores (issue 3's 16-byte alignment), decode_topk's logits in
    16-byte bulk reads."""
    mla = _contract("sparse_mla_decode").POINTER_ALIGN
    assert all(mla[name] >= 16 for name in ("out", "q", "swa_kv", "compressed_kv"))
    assert _contract("decode_topk").POINTER_ALIGN["logits"] >= 16


# CuTe DSL names a pointer parameter ptr<type>gmem[align<N>] in the kernel's symbol (no align: the element's own).
_SYMBOL_POINTER = re.compile(r"_ptr(i8|i16|i32|f32|bf16|f16)gmem(?:align(\d+))?(?=_ptr|__)")  # whole ones only
_ELEMENT_BYTES = {"i8": 1, "i16": 2, "i32": 4, "f32": 4, "bf16": 2, "f16": 2}


@pytest.mark.parametrize("arch", contracts.ARCHS)
def test_committed_cubins_declare_no_more_alignment_than_the_host_guarantees(arch):
    """The manifest's symbols (CuTe DSL cuts long ones short: the pointers it shows are checked)."""
    kernels = json.loads(manifest_path(REPO, arch).read_text())["kernels"]
    for entry in kernels:
        aligns = list(getattr(_contract(entry["family"]), "POINTER_ALIGN", {}).items())
        declared = [int(n) if n else _ELEMENT_BYTES[t] for t, n in _SYMBOL_POINTER.findall(entry["symbol"])]
        assert len(declared) <= len(aligns) and (declared or not aligns), entry["name"]
        for (name, guaranteed), assumed in zip(aligns, declared):
            assert assumed <= guaranteed, (f"{entry['name']}: its cubin assumes {name} {assumed}-byte aligned, the "
                                           f"host op guarantees {guaranteed}")


def test_each_kernel_is_compiled_to_assume_its_contracts_alignment(monkeypatch):
    """What the build tells the compiler, pointer by pointer, for one variant of each family (no compile run)."""
    pytest.importorskip("cutlass", reason="the kernels' sources need nvidia-cutlass-dsl (extra 'build')")
    import kernels
    from kernels import compile as kernel_compile

    declared, real = [], kernel_compile.make_ptr

    def recording(*args, assumed_align, **kwargs):
        declared.append(assumed_align)
        return real(*args, assumed_align=assumed_align, **kwargs)

    for family in FAMILIES_WITH_POINTERS:
        module = importlib.import_module(kernels.BUILDERS[family])
        monkeypatch.setattr(kernel_compile, "make_ptr", recording)
        monkeypatch.setattr(module, "cubin_of", lambda *args, arch: b"cubin")
        contract = _contract(family)
        for variant in contract.VARIANTS[:1] + contract.VARIANTS[-1:]:
            declared.clear()
            assert module.compile_variant(variant, "sm_90a") == b"cubin"
            assert declared == list(contract.POINTER_ALIGN.values()), variant.name


def _below(name, family) -> int:
    """A byte offset under the contract's alignment for ``name`` (half of it): the host must not pass it on."""
    return _contract(family).POINTER_ALIGN[name] // 2


def _topk_args():
    return {"logits": torch.randn(2, 4096), "row_ends": torch.full((2,), 4096, dtype=I32),
            "out": torch.zeros(2, 512, dtype=I32)}


@pytest.mark.parametrize("name", ["row_ends", "out"])
def test_decode_topk_refuses_row_ends_and_out_under_their_alignment(name):
    args = _topk_args()
    args[name] = at_byte_offset(args[name], _below(name, "decode_topk"))
    with pytest.raises(ValueError, match=f"{name} must start at a 4-byte aligned address"):
        topk.decode_topk(args["logits"], args["row_ends"], args["out"])


@pytest.mark.parametrize("offset", [4, 8, 12])
def test_decode_topk_sends_logits_under_their_alignment_to_the_exact_fallback(offset):
    logits = at_byte_offset(torch.randn(2, 4096), offset)
    assert offset < _contract("decode_topk").POINTER_ALIGN["logits"]
    assert "not a multiple of 16 bytes" in topk._layout_refusal(logits, 2)
    assert topk._layout_refusal(at_byte_offset(torch.randn(2, 4096), 16), 2) is None


@pytest.mark.parametrize("name", ["row_ends", "out"])
def test_decode_topk_takes_row_ends_and_out_at_their_alignment(name):
    args = _topk_args()
    expected = args["out"].clone()
    topk.decode_topk(args["logits"], args["row_ends"], expected)
    args[name] = at_byte_offset(args[name], _contract("decode_topk").POINTER_ALIGN[name])
    assert args[name].data_ptr() % 16 == 4
    topk.decode_topk(args["logits"], args["row_ends"], args["out"])
    assert torch.equal(args["out"], expected)


def _mla_args():
    T = 2
    return {"q": torch.randn(T, 16, 512).to(FP8), "swa_kv": torch.randn(64, 512).to(FP8),
            "compressed_kv": torch.randn(64, 512).to(FP8),
            "indices": torch.randint(0, 64, (T, 128), dtype=I32), "lens": torch.full((T,), 128, dtype=I32),
            "sinks": torch.zeros(16), "out": torch.empty(T, 16, 512, dtype=torch.bfloat16)}


def _mla(args):
    return sparse_mla_decode(args["q"], args["swa_kv"], args["compressed_kv"], args["indices"], args["lens"],
                             sinks=args["sinks"], bmm1_scale=0.04, bmm2_scale=1.0, out=args["out"])


@pytest.mark.parametrize("name", _pointer_names("sparse_mla_decode"))
def test_sparse_mla_refuses_each_pointer_under_its_alignment(name):
    args = _mla_args()
    args[name] = at_byte_offset(args[name], _below(name, "sparse_mla_decode"))
    align = _contract("sparse_mla_decode").POINTER_ALIGN[name]
    with pytest.raises(ValueError, match=f"{name} must start at a {align}-byte aligned address"):
        _mla(args)


@pytest.mark.parametrize("name", ["indices", "lens", "sinks"])
def test_sparse_mla_takes_indices_lens_and_sinks_at_their_alignment(name):
    args = _mla_args()
    expected = _mla(dict(args, out=args["out"].clone()))
    args[name] = at_byte_offset(args[name], _contract("sparse_mla_decode").POINTER_ALIGN[name])
    assert args[name].data_ptr() % 16 == 4
    assert torch.equal(_mla(args), expected)


def _pool_rows_args():
    return {"topk_indices": torch.randint(-1, 128, (3, 8), dtype=I32),
            "block_table": torch.arange(6, dtype=I32).reshape(3, 2), "out": torch.empty(3, 8, dtype=I32)}


@pytest.mark.parametrize("name", _pointer_names("topk_pool_rows"))
def test_topk_pool_rows_refuses_each_pointer_under_its_alignment(name):
    args = _pool_rows_args()
    args[name] = at_byte_offset(args[name], _below(name, "topk_pool_rows"))
    with pytest.raises(ValueError, match=f"{name} must start at a 4-byte aligned address"):
        topk_pool_rows(args["topk_indices"], args["block_table"], out=args["out"])
