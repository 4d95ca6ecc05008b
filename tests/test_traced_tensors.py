"""Tensors with a shape and no memory that the host ops could read: a FakeTensor (a FakeTensorMode, make_fx's
tracing; torch.compile takes the ops as custom ops: test_compiled_ops.py) and a tensor whose data pointer torch
refuses. Each op names the argument and says how to call it (on real tensors, or through the custom ops) before
anything runs, for every tensor argument, without torch's warning about the read (which the ops' check of a wrapper
without memory used to trigger: torch 2.13 warns and returns 0, 2.11 raised an error naming no argument)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from indexer_cases import make_state, make_step
from odd_tensors import PointerRefused

from runtime.indexer import SingleRank, decode_rows
from runtime.sparse_mla import sparse_mla_decode
from runtime.topk import decode_topk

FP8 = torch.float8_e4m3fn


def _topk_args():
    return {"logits": torch.randn(2, 4096), "row_ends": torch.full((2,), 4096, dtype=torch.int32),
            "out": torch.empty(2, 512, dtype=torch.int32)}


def _topk(a):
    decode_topk(a["logits"], a["row_ends"], a["out"])


def _mla_args():
    return {"q": torch.zeros(3, 16, 512).to(FP8), "swa_kv": torch.zeros(64, 512).to(FP8),
            "compressed_kv": torch.zeros(64, 512).to(FP8), "indices": torch.zeros(3, 128, dtype=torch.int32),
            "lens": torch.ones(3, dtype=torch.int32), "sinks": torch.zeros(16),
            "out": torch.empty(3, 16, 512, dtype=torch.bfloat16)}


def _mla(a):
    sparse_mla_decode(a["q"], a["swa_kv"], a["compressed_kv"], a["indices"], a["lens"], sinks=a["sinks"],
                      bmm1_scale=1.0, bmm2_scale=1.0, out=a["out"])


def _indexer_args():
    step = make_step(8, heads=32, head_dim=64, k=16)
    return {"step": step, "q": step.q, "weights": step.weights, "seq_lens": step.metadata.seq_lens,
            "block_table": step.metadata.block_table}


def _indexer(a):
    metadata = dataclasses.replace(a["step"].metadata, seq_lens=a["seq_lens"], block_table=a["block_table"])
    decode_rows(make_state(a["step"]), metadata, a["q"], a["weights"], SingleRank())


OPS = {"decode_topk": (_topk_args, _topk), "sparse_mla_decode": (_mla_args, _mla),
       "decode_rows": (_indexer_args, _indexer)}
CASES = [("decode_topk", name, name) for name in ("logits", "row_ends", "out")]
CASES += [("sparse_mla_decode", name, name)
          for name in ("q", "swa_kv", "compressed_kv", "indices", "lens", "sinks", "out")]
CASES += [("decode_rows", name, name) for name in ("q", "weights")]
CASES += [("decode_rows", name, f"metadata.{name}") for name in ("seq_lens", "block_table")]


@pytest.mark.parametrize("op, name, shown", CASES, ids=[f"{op}-{name}" for op, name, _ in CASES])
@pytest.mark.parametrize("kind", ("fake", "pointer_refused"))
def test_ops_name_a_tensor_without_memory(op, name, shown, kind):
    from torch._subclasses.fake_tensor import FakeTensorMode

    make_args, run = OPS[op]
    args = make_args()
    if kind == "fake":
        args[name] = FakeTensorMode().from_tensor(args[name])
        match = rf"^{shown} is a FakeTensor: a shape without memory.*torch\.ops\.sparse_decode_aot"
    else:
        args[name] = args[name].as_subclass(PointerRefused)
        match = rf"^{shown} is a PointerRefused whose data pointer torch does not give .*torch\.ops\.sparse_decode_aot"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning about a FakeTensor's data_ptr() read fails the test
        with pytest.raises(TypeError, match=match):
            run(args)


@pytest.mark.parametrize("transform", ("vmap", "grad"))
@pytest.mark.parametrize("op", ("decode_topk", "sparse_mla_decode"))
def test_ops_name_a_torch_func_transforms_tensor(op, transform):
    """Inside torch.vmap or torch.func.grad the ops' tensors are functorch wrappers whose data pointer torch refuses:
    refused naming the argument, with the fix for a transform (call outside it), not a DTensor's or a trace's."""
    make_args, run = OPS[op]
    first = "logits" if op == "decode_topk" else "q"
    args = make_args()

    def call(x):
        run({**args, first: x})
        return x.float().sum()

    match = rf"^{first} is a tensor of a torch\.func transform .*call it outside the transform"
    with pytest.raises(TypeError, match=match):
        if transform == "vmap":
            torch.vmap(call)(args[first].unsqueeze(0).expand(2, *args[first].shape).contiguous())
        else:
            torch.func.grad(call)(args[first].float() if op == "decode_topk" else args[first])


WRITTEN = [("decode_topk", "out"), ("sparse_mla_decode", "out")]


@pytest.mark.parametrize("op, name", WRITTEN, ids=[op for op, _ in WRITTEN])
@pytest.mark.parametrize("kind", ("negated", "sparse"))
def test_an_out_refused_as_no_plain_tensor_is_told_to_allocate_one(op, name, kind):
    """An out that is a lazily negated view or a sparse tensor was told to pass out.resolve_neg() or out.to_dense(),
    copies: following the fix, the op wrote the copy and the caller's out stayed unwritten, said by nothing. The fix
    is to allocate a plain out."""
    make_args, run = OPS[op]
    args = make_args()
    args[name] = torch._neg_view(args[name]) if kind == "negated" else args[name].to_sparse()
    with pytest.raises(TypeError, match=rf"^{name} .*; allocate {name} as a plain dense tensor and pass it \(a "
                                        r"converted copy would take the result\)$"):
        run(args)


@pytest.mark.parametrize("kind", ("fake", "pointer_refused"))
def test_decode_topks_queries_answer_no_for_a_tensor_without_memory(kind):
    """supports_decode_topk and decode_topk_plan take any call, answering False or None where the op would not launch
    the kernel; a CUDA tensor whose data pointer torch refuses raised torch's RuntimeError naming nothing, and a CUDA
    FakeTensor had torch warn of the read and answer from address 0."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runtime.topk import decode_topk_plan, supports_decode_topk

    class CudaPointerRefused(PointerRefused):
        @property
        def is_cuda(self):
            return True

    if kind == "fake":
        with FakeTensorMode():
            logits = torch.empty(2, 1024, device="cuda")
    else:
        logits = torch.zeros(2, 1024).as_subclass(CudaPointerRefused)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert supports_decode_topk(logits, 2, 512, False) is False
        assert decode_topk_plan(logits, 2, 512, False) is None
