"""The host ops inside torch.compile (CPU here: the exact fallbacks run; the kernels' launch is the same call).

A function that calls decode_topk or sparse_mla_decode compiles to one graph (fullgraph=True: no graph break) that
holds each op as one custom op node (sparse_decode_aot::...), with static and dynamic shapes, and gives the eager
results; the indexer's steps run eagerly inside a compiled function (a graph break each) and give the eager buffers.
Before, the tracer followed the ops' host checks into a FakeTensor's storage size, which symbolic shapes refuse, and
the compile failed with torch's error. The scalar flags are still refused while tracing, and an out that overlaps
an input never gives a wrong result (refused, or computed on functionalization's copy).
"""

from __future__ import annotations

import re

import pytest
import torch
from indexer_cases import make_state, make_step

from runtime.indexer import (
    SingleRank,
    decode_rows,
    finish_decode_rows,
    plan_decode_rows,
)
from runtime.reference import decode_topk_reference, sparse_mla_decode_reference
from runtime.sparse_mla import sparse_mla_decode
from runtime.topk import decode_topk

FP8 = torch.float8_e4m3fn


def _compile(fn, dynamic, compiler="aot_eager"):
    """``fn`` compiled in one graph by ``compiler`` (aot_eager: torch's functionalization of the op's write to
    ``out``; inductor: that and generated code around the op, which needs a C++ compiler here), and the custom ops
    each traced graph called."""
    called = []

    def backend(gm, example_inputs):
        called.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                      and str(n.target).startswith("sparse_decode_aot."))
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(compiler)(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic), called


# (dynamic shapes, compiler): inductor on static shapes only (its compile takes ~10-20 s a graph on this CPU)
MODES = [(False, "aot_eager"), (True, "aot_eager"), (False, "inductor")]
MODE_IDS = ["static", "dynamic", "inductor"]


@pytest.mark.parametrize("dynamic, compiler", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("block_mode", (False, True), ids=("token", "block"))
def test_decode_topk_compiles_to_one_custom_op(dynamic, compiler, block_mode):
    def step(logits, row_ends, out):
        decode_topk(logits * 2.0, row_ends, out, block_mode=block_mode)
        return out + 1  # a use of the op's write

    compiled, called = _compile(step, dynamic, compiler)
    g = torch.Generator().manual_seed(3)
    for rows, width in ((3, 4096), (5, 1000)):  # the second shape: a recompile, or the dynamic graph again
        logits = torch.randn(rows, width, generator=g)
        row_ends = torch.tensor([width, 7, 0, width - 3, 600][:rows], dtype=torch.int32)
        out = torch.full((rows, 512), -7, dtype=torch.int32)
        got = compiled(logits, row_ends, out)
        want = decode_topk_reference(logits * 2.0, row_ends, 512, block_mode=block_mode)
        assert torch.equal(torch.sort(got - 1, 1).values, torch.sort(want, 1).values)
        assert torch.equal(torch.sort(out, 1).values, torch.sort(want, 1).values), "out written"
    assert called and set(called) == {"sparse_decode_aot.decode_topk.default"}


@pytest.mark.parametrize("dynamic, compiler", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("given_out", (False, True), ids=("allocated", "given_out"))
def test_sparse_mla_decode_compiles_to_one_custom_op(dynamic, compiler, given_out):
    def step(q, swa_kv, compressed_kv, indices, lens, sinks, out):
        o = sparse_mla_decode(q, swa_kv, compressed_kv, indices, lens, sinks=sinks, bmm1_scale=0.05,
                              bmm2_scale=1.5, out=out)
        return o.float().sum(-1)

    compiled, called = _compile(step, dynamic, compiler)
    g = torch.Generator().manual_seed(5)
    for T in (3, 2):
        q = (torch.randn(T, 16, 512, generator=g) * 2).to(FP8)
        swa, comp = ((torch.randn(rows, 512, generator=g) * 2).to(FP8) for rows in (40, 70))
        indices = torch.randint(-1, 80, (T, 640), dtype=torch.int32, generator=g)
        lens = torch.tensor([640, 100, 0][:T], dtype=torch.int32)
        sinks = torch.randn(16, generator=g)
        out = torch.empty(T, 16, 512, dtype=torch.bfloat16) if given_out else None
        got = compiled(q, swa, comp, indices, lens, sinks, out)
        want = sparse_mla_decode_reference(q, swa, comp, indices, lens, sinks=sinks, bmm1_scale=0.05, bmm2_scale=1.5)
        torch.testing.assert_close(got, want.float().sum(-1))
        if given_out:
            assert torch.equal(out, want), "out written"
    assert called and set(called) == {"sparse_decode_aot.sparse_mla_decode.default"}


def test_flags_and_scales_are_refused_while_tracing():
    logits, row_ends, out = torch.randn(2, 64), torch.full((2,), 64, dtype=torch.int32), torch.empty(2, 512,
                                                                                                   dtype=torch.int32)
    with pytest.raises(Exception, match="block_mode must be a Python bool"):
        _compile(lambda a, b, c: decode_topk(a, b, c, block_mode=1), False)[0](logits, row_ends, out)
    q = torch.zeros(1, 16, 512).to(FP8)
    pool = torch.zeros(8, 512).to(FP8)
    args = (q, pool, pool, torch.zeros(1, 128, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    with pytest.raises(Exception, match="bmm1_scale must be small enough"):
        _compile(lambda *a: sparse_mla_decode(*a, bmm1_scale=1e31, bmm2_scale=1.0), False)[0](*args)


def _eager_refusal(fn, *args):
    with pytest.raises((TypeError, ValueError)) as eager:
        fn(*args)
    return eager.type, str(eager.value)


def _topk_args(**given):
    args = {"logits": torch.randn(2, 64), "row_ends": torch.full((2,), 64, dtype=torch.int32),
            "out": torch.empty(2, 512, dtype=torch.int32)}
    return tuple({**args, **given}.values())


def _mla_args(**given):
    pool = torch.zeros(8, 512).to(FP8)
    args = {"q": torch.zeros(1, 16, 512).to(FP8), "swa_kv": pool, "compressed_kv": pool,
            "indices": torch.zeros(1, 128, dtype=torch.int32), "lens": torch.ones(1, dtype=torch.int32),
            "sinks": None, "out": None}
    return tuple({**args, **given}.values())


def _mla(q, swa_kv, compressed_kv, indices, lens, sinks, out):
    return sparse_mla_decode(q, swa_kv, compressed_kv, indices, lens, sinks=sinks, bmm1_scale=0.05, bmm2_scale=1.0,
                             out=out)


@pytest.mark.parametrize("op, args", [
    # Traced, decode_topk with out=None wrote nothing and raised nothing; a list of logits failed in the tracer.
    (decode_topk, _topk_args(out=None)),
    (decode_topk, _topk_args(logits=[[1.0] * 64] * 2)),
    (decode_topk, _topk_args(row_ends=[64, 64])),
    # sparse_mla_decode allocated out from q's shape first: a 0-d q was an IndexError while tracing, a list the
    # tracer's own error.
    (_mla, _mla_args(q=torch.zeros((), dtype=FP8))),
    (_mla, _mla_args(q=[[0.0] * 512] * 16)),
], ids=["topk-out-None", "topk-logits-list", "topk-row_ends-list", "mla-q-0d", "mla-q-list"])
def test_an_argument_that_is_no_tensor_is_refused_inside_torch_compile_as_eagerly(op, args):
    """What the host checks refuse eagerly is refused alike in a compiled function: the same exception type and
    message, not a tracer's error or (decode_topk with out=None) nothing at all."""
    kind, message = _eager_refusal(op, *args)
    torch._dynamo.reset()
    with pytest.raises(kind) as compiled:
        torch.compile(op, backend="aot_eager")(*args)
    assert str(compiled.value) == message


def _listed(args: tuple, at: int) -> tuple:
    return args[:at] + (args[at].tolist(),) + args[at + 1:]


_MLA_FULL = _mla_args(sinks=torch.zeros(16), out=torch.empty(1, 16, 512, dtype=torch.bfloat16))
_TOPK_FULL = _topk_args()


@pytest.mark.parametrize("dynamic", (None, True), ids=("default", "dynamic"))
@pytest.mark.parametrize("op, args", [(_mla, _listed(_MLA_FULL, i)) for i in range(len(_MLA_FULL))]
                         + [(decode_topk, _listed(_TOPK_FULL, i)) for i in range(len(_TOPK_FULL))],
                         ids=[f"mla-{n}" for n in ("q", "swa_kv", "compressed_kv", "indices", "lens", "sinks", "out")]
                         + [f"topk-{n}" for n in ("logits", "row_ends", "out")])
def test_every_tensor_argument_given_as_a_list_is_refused_as_eagerly_by_plain_torch_compile(op, args, dynamic):
    """Plain torch.compile (no fullgraph) runs a frame whose trace raised eagerly and compiles the functions it calls:
    sparse_mla_decode's tensor checks then read a FakeTensor's nbytes, which symbolic shapes refuse, so a list for any
    of its arguments after the first two ended in Dynamo's TorchRuntimeError, not the eager TypeError. Twice: the
    second call recompiles with dynamic shapes."""
    kind, message = _eager_refusal(op, *args)
    torch._dynamo.reset()
    compiled = torch.compile(op, backend="aot_eager", dynamic=dynamic)
    for _ in range(2):
        with pytest.raises(kind) as refused:
            compiled(*args)
        assert str(refused.value) == message


@pytest.mark.parametrize("op, given, said", [
    ("mla", {"bmm1_scale": 1e31}, "bmm1_scale must be small enough"),
    ("mla", {"bmm2_scale": True}, "bmm2_scale must be a real number, got bool"),
    ("mla", {"pdl": "x"}, "pdl must be a Python bool"),
    ("topk", {"block_mode": 1}, "block_mode must be a Python bool"),
    ("topk", {"pdl": "x"}, "pdl must be a Python bool"),
])
def test_flags_and_scales_are_refused_as_eagerly_by_plain_torch_compile(op, given, said):
    """The same for the scalars: refused with the eager message by a compile without fullgraph too."""
    def call(*args):
        if op == "topk":
            return decode_topk(*args, **given)
        return sparse_mla_decode(*args, **{"bmm1_scale": 0.05, "bmm2_scale": 1.0, **given})

    args = _topk_args() if op == "topk" else _mla_args()[:5]
    kind, message = _eager_refusal(call, *args)
    assert said in message
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="aot_eager")
    for _ in range(2):
        with pytest.raises(kind) as refused:
            compiled(*args)
        assert str(refused.value) == message


@pytest.mark.parametrize("flow", ("decode_rows", "plan_then_finish"))
def test_indexer_steps_run_eagerly_inside_a_compiled_function(flow):
    step = make_step(8, heads=32, head_dim=64, k=16)
    eager = make_state(step)
    decode_rows(eager, step.metadata, step.q, step.weights, SingleRank())
    state = make_state(step)

    def run(q, weights):
        if flow == "decode_rows":
            rows = decode_rows(state, step.metadata, q, weights, SingleRank())
        else:
            plan = plan_decode_rows(state, step.metadata, SingleRank())
            rows = finish_decode_rows(state, q, weights, plan, SingleRank())
        return rows + 1

    torch._dynamo.reset()
    got = torch.compile(run, backend="aot_eager")(step.q, step.weights)
    assert torch.equal(state.topk_indices, eager.topk_indices)
    assert torch.equal(got - 1, eager.topk_indices)


@pytest.mark.parametrize("name", ("bmm1_scale", "bmm2_scale"))
def test_bool_scale_is_refused_while_tracing(name):
    # float(True) is 1.0: without the traced call's own scale check a bool would run as a scale of one, and the
    # real call inside the custom op would see a float and never name the argument
    q = torch.zeros(1, 16, 512).to(FP8)
    pool = torch.zeros(8, 512).to(FP8)
    args = (q, pool, pool, torch.zeros(1, 128, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    scales = {"bmm1_scale": 1.0, "bmm2_scale": 1.0, name: True}
    with pytest.raises(Exception, match=f"{name} must be a real number, got bool"):
        _compile(lambda *a: sparse_mla_decode(*a, **scales), False)[0](*args)


def _out_over_row_ends(rows=3, k=512):
    """decode_topk's ``out`` and a ``row_ends`` that shares its last row's first words (both int32, so torch's
    functionalization keeps the alias)."""
    words = torch.zeros(rows * k, dtype=torch.int32)
    out = words.view(rows, k)
    row_ends = words[(rows - 1) * k:(rows - 1) * k + rows]
    return out, row_ends


@pytest.mark.parametrize("compiler", ("aot_eager", "inductor"))
def test_out_overlapping_an_input_is_never_computed_wrong_inside_torch_compile(compiler):
    # Eager calls refuse an out that overlaps an input. Traced, the op receives what torch's functionalization hands
    # it: aot_eager a copy of out (the result is then right, computed from the inputs as they were), inductor the
    # real out once it writes in place, which the op's own check refuses. Either way no wrong result.
    out, row_ends = _out_over_row_ends()
    row_ends.copy_(torch.tensor([1000, 7, 600], dtype=torch.int32))
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(9))
    want = decode_topk_reference(logits, row_ends.clone(), 512)
    with pytest.raises(ValueError, match="out overlaps row_ends's memory"):
        decode_topk(logits, row_ends, out)
    # the custom op itself, as a graph that writes in place calls it with the alias, refuses alike
    with pytest.raises(ValueError, match="out overlaps row_ends's memory"):
        torch.ops.sparse_decode_aot.decode_topk(logits, row_ends, out, False, True)

    def step(logits, row_ends, out):
        decode_topk(logits, row_ends, out)
        return out

    compiled = _compile(step, False, compiler)[0]
    # Which of the two a compiler does is torch's choice (this torch: aot_eager copies, inductor passes the alias);
    # either is right, a result from the alias without the refusal is not.
    try:
        got = compiled(logits, row_ends, out)
    except Exception as refused:  # noqa: BLE001 - torch wraps the op's ValueError in its own exception types
        assert "out overlaps row_ends's memory" in str(refused)
        return
    assert torch.equal(torch.sort(got, 1).values, torch.sort(want, 1).values)
    assert torch.equal(got, out), "out written"


def test_sparse_mla_out_over_q_is_refused_inside_torch_compile():
    # out (BF16) can overlap an input only across dtypes (q and the pools FP8, indices and lens int32, sinks FP32),
    # a mutation of a view that aot_autograd refuses before the op runs
    T = 2
    raw = torch.zeros(T * 16 * 512 * 2, dtype=torch.uint8)
    out = raw.view(torch.bfloat16).view(T, 16, 512)
    q = raw[:T * 16 * 512].view(FP8).view(T, 16, 512)
    pool = torch.ones(40, 512).to(FP8)
    args = (q, pool, pool, torch.zeros(T, 128, dtype=torch.int32), torch.full((T,), 128, dtype=torch.int32))
    kw = {"bmm1_scale": 0.05, "bmm2_scale": 1.0}
    with pytest.raises(ValueError, match="out overlaps q's memory"):
        sparse_mla_decode(*args, out=out, **kw)
    compiled = _compile(lambda *a, out: sparse_mla_decode(*a, out=out, **kw), False)[0]
    # aot_autograd's own refusal on this torch; the op's check would name out where a later torch passed it the alias
    with pytest.raises(Exception, match="views with different dtypes|out overlaps q's memory"):
        compiled(*args, out=out)
    assert not out.any(), "out untouched"


@pytest.mark.parametrize("dynamic, compiler", MODES + [(True, "inductor")], ids=MODE_IDS + ["inductor-dynamic"])
def test_decode_topk_writes_a_slice_of_a_wider_buffer_inside_torch_compile(dynamic, compiler):
    # out = rows and columns sliced from a wider buffer (accepted eagerly: unit column stride, rows apart). Inductor
    # with dynamic shapes handed the op that view at storage offset 0 (pytorch/pytorch#198068): the buffer's first
    # rows were written, the slice's last row never.
    k = 512

    def step(logits, row_ends, buf):
        out = buf[1:-1, 3:3 + k]
        decode_topk(logits, row_ends, out)
        return out.sum(1)

    compiled, called = _compile(step, dynamic, compiler)
    g = torch.Generator().manual_seed(11)
    for rows, width in ((3, 5000), (2, 3000)):
        logits = torch.randn(rows, width, generator=g)
        row_ends = torch.tensor([width, 700, 9][:rows], dtype=torch.int32)
        buf = torch.full((rows + 2, k + 10), -9, dtype=torch.int32)
        got = compiled(logits, row_ends, buf)
        want = decode_topk_reference(logits, row_ends, k)
        assert torch.equal(torch.sort(buf[1:-1, 3:3 + k], 1).values, torch.sort(want, 1).values), "the slice written"
        assert torch.equal(got, want.sum(1)), "the write seen after the op"
        rest = buf.clone()
        rest[1:-1, 3:3 + k] = -9
        assert (rest == -9).all(), "nothing outside the slice written"
    assert called and set(called) == {"sparse_decode_aot.decode_topk.default"}


@pytest.mark.parametrize("dynamic, compiler", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("strides", ((100, 1), (512, 2)), ids=("rows-overlap", "column-stride"))
def test_an_out_view_the_kernel_cannot_write_is_refused_inside_torch_compile_as_eagerly(dynamic, compiler, strides):
    # Traced, an out that is a view is written through a fresh tensor, which the op checks in out's place: a view
    # whose rows overlap (or whose columns are not adjacent), refused eagerly, was filled by one copy_, the later
    # rows over the earlier ones' slots (a wrong top-k, no error).
    rows, k = 2, 512
    logits = torch.randn(rows, 600, generator=torch.Generator().manual_seed(5))
    row_ends = torch.full((rows,), 600, dtype=torch.int32)
    words = torch.full((4 * rows * k,), -9, dtype=torch.int32)
    out = words.as_strided((rows, k), strides)
    said = _eager_refusal(decode_topk, logits, row_ends, out)
    assert "out" in said[1] and (words == -9).all()

    def step(logits, row_ends, out):
        decode_topk(logits, row_ends, out)
        return out

    # (with dynamic shapes the message shows the strides as symbols)
    with pytest.raises(Exception, match=re.escape(re.split(r",| \(", said[1])[0])):
        _compile(step, dynamic, compiler)[0](logits, row_ends, out)
    assert (words == -9).all(), "out untouched"


def test_topk_pool_rows_runs_eagerly_inside_a_compiled_function():
    """topk_pool_rows inside torch.compile is a graph break that runs the eager call (as the indexer's steps): the
    same rows, out written (a row-strided one too), and a bad argument refused with the eager message."""
    from indexer_cases import pool_rows_case, pool_rows_loop

    from runtime.indexer import topk_pool_rows

    topk, table = pool_rows_case(14, 5, 6, 64, 64)
    want = pool_rows_loop(topk, table, 64)
    indices = torch.full((5, 192), 77, dtype=torch.int32)

    def step(topk, table, out):
        return topk_pool_rows(topk, table) + 1, topk_pool_rows(topk, table, out=out)

    torch._dynamo.reset()
    got, written = torch.compile(step, backend="aot_eager")(topk, table, indices[:, 128:])
    assert torch.equal(got - 1, want) and torch.equal(written, want)
    assert torch.equal(indices[:, 128:], want) and (indices[:, :128] == 77).all()
    kind, message = _eager_refusal(lambda t, b: topk_pool_rows(t, b, page_size=0), topk, table)
    torch._dynamo.reset()
    with pytest.raises(kind) as refused:
        torch.compile(lambda t, b: topk_pool_rows(t, b, page_size=0), backend="aot_eager")(topk, table)
    assert str(refused.value) == message


@pytest.mark.parametrize("op", ("topk_pool_rows", "decode_rows"))
def test_a_non_strict_export_names_the_fake_tensor_instead_of_recursing(op):
    """A non-strict torch.export runs no Dynamo: is_compiling() is True inside the eager wrappers too, which called
    the public function again until a RecursionError. They run the bodies, whose checks name the traced tensor."""
    from indexer_cases import pool_rows_case

    from runtime.indexer import topk_pool_rows

    if op == "topk_pool_rows":
        args, name = pool_rows_case(15, 4, 6, 64, 64), "topk_indices"

        def forward(topk, table):
            return topk_pool_rows(topk, table) + 1
    else:
        step = make_step(8, heads=32, head_dim=64, k=16)
        state = make_state(step)
        args, name = (step.q, step.weights), "q"

        def forward(q, weights):
            decode_rows(state, step.metadata, q, weights, SingleRank())
            return weights + 1

    module = type("Step", (torch.nn.Module,), {"forward": lambda self, *a: forward(*a)})()
    with pytest.raises(TypeError, match=f"{name} is a FakeTensor"):
        torch.export.export(module, args, strict=False)


@pytest.mark.parametrize("tracing_mode", ("real", "fake", "symbolic"))
def test_make_fx_records_each_op_as_its_custom_op(tracing_mode):
    """make_fx hands the ops tensors under a proxy mode, where is_compiling() is False. In its real mode the ops ran
    eagerly: on a GPU the kernel launched through the driver once, at trace time, and the graph kept no node that
    writes out (replayed, it returned out unwritten); in its fake and symbolic modes they refused the FakeTensor.
    Each op is now one custom op node there too, and the replayed graph writes out."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(logits, row_ends, topk_out, q, swa_kv, compressed_kv, indices, lens, sinks, mla_out):
        decode_topk(logits, row_ends, topk_out)
        sparse_mla_decode(q, swa_kv, compressed_kv, indices, lens, sinks=sinks, bmm1_scale=0.05, bmm2_scale=1.5,
                          out=mla_out)
        return topk_out.clone(), mla_out.clone()

    g = torch.Generator().manual_seed(9)
    logits, row_ends = torch.randn(2, 1024, generator=g), torch.tensor([1024, 600], dtype=torch.int32)
    q = (torch.randn(2, 16, 512, generator=g) * 2).to(FP8)
    swa, comp = ((torch.randn(rows, 512, generator=g) * 2).to(FP8) for rows in (40, 70))
    indices = torch.randint(-1, 80, (2, 640), dtype=torch.int32, generator=g)
    lens, sinks = torch.tensor([640, 100], dtype=torch.int32), torch.randn(16, generator=g)

    def outs():
        return torch.full((2, 512), -7, dtype=torch.int32), torch.zeros(2, 16, 512, dtype=torch.bfloat16)

    graph = make_fx(step, tracing_mode=tracing_mode)(logits, row_ends, outs()[0], q, swa, comp, indices, lens, sinks,
                                                     outs()[1])
    ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert ops == ["sparse_decode_aot.decode_topk.default", "sparse_decode_aot.sparse_mla_decode.default",
                   "aten.clone.default", "aten.clone.default"], ops
    topk_out, mla_out = outs()
    graph(logits, row_ends, topk_out, q, swa, comp, indices, lens, sinks, mla_out)
    want = decode_topk_reference(logits, row_ends, 512)
    assert torch.equal(torch.sort(topk_out, 1).values, torch.sort(want, 1).values), "out written by the replay"
    assert torch.equal(mla_out, sparse_mla_decode_reference(q, swa, comp, indices, lens, sinks=sinks,
                                                            bmm1_scale=0.05, bmm2_scale=1.5))


def test_a_call_inside_a_fake_tensor_mode_runs_the_custom_ops_fake(monkeypatch):
    """Real tensors under an active FakeTensorMode (allow_non_fake_inputs) passed every check, then the out allocated
    for out=None was a FakeTensor, launched at address 0 (an illegal address on a GPU). The call is now the custom
    op, whose fake gives the out's shape; nothing is launched."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from runtime import sparse_mla, topk

    launched = []
    for module in (sparse_mla, topk):
        monkeypatch.setattr(module, "launch_on", lambda *args: launched.append(args))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16, 512, generator=g).to(FP8)
    swa, comp = (torch.randn(rows, 512, generator=g).to(FP8) for rows in (40, 70))
    idx, lens = torch.randint(-1, 80, (2, 640), dtype=torch.int32, generator=g), torch.tensor([640, 100],
                                                                                             dtype=torch.int32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = sparse_mla_decode(q, swa, comp, idx, lens, bmm1_scale=0.05, bmm2_scale=1.0)
        decode_topk(torch.randn(2, 1024), torch.full((2,), 1024, dtype=torch.int32),
                    topk_out := torch.empty(2, 512, dtype=torch.int32))
    assert isinstance(out, FakeTensor) and out.shape == (2, 16, 512) and isinstance(topk_out, FakeTensor)
    assert not launched
