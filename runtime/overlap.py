"""Tensor memory extents: whether two tensors' bytes overlap (the host ops refuse an output that shares
memory with an input), and whether a tensor's view lies inside its storage.

A kernel reads its inputs while other CTAs write the output, so an ``out`` that overlaps an input
(fully or partly) changes what is read mid-launch: wrong results, and where a kernel re-reads its
input and relies on the counts of an earlier pass (decode_topk), writes past its slots. The host
ops' tensors are laid out as rows of contiguous bytes (contiguous, or 2-D with unit column
stride), so the check is exact: no false alarm for disjoint rows of one buffer. Other strided
layouts (a gather's result) are read in pieces of such rows, exact too up to _MAX_PIECES.
"""

from __future__ import annotations

import torch


def _runs(t: torch.Tensor):
    """(first byte, runs, bytes between runs, bytes a run) of a contiguous tensor or a 2-D one with
    unit column stride; a list of such for any other layout (_strided_runs); None when it holds no
    element or no memory (meta: every data_ptr is 0)."""
    nbytes = t.nbytes
    if nbytes == 0 or t.is_meta:
        return None
    if t.is_contiguous():
        return t.data_ptr(), 1, 0, nbytes
    es, shape, strides = t.element_size(), t.shape, t.stride()
    if len(shape) != 2 or strides[1] != 1:
        return _strided_runs(t, es)
    return t.data_ptr(), shape[0], strides[0] * es, shape[1] * es


# A layout of more pieces than this is read as its whole byte span: a false alarm at worst, never a miss.
_MAX_PIECES = 256


def _strided_runs(t: torch.Tensor, es: int) -> list:
    """The layouts the host ops do not pass (a gather's result may be column-strided, transposed or 3-D) as a list
    of _runs tuples, exact up to _MAX_PIECES: read as rows of adjacent columns, such a view's bytes past
    ``cols * es`` went unseen (a miss) and a 1-D or 3-D one failed to unpack."""
    start = t.data_ptr()
    # A dimension of one index or of stride 0 adds no byte; one of stride 1 makes each run that many elements.
    dims = [(n, s) for n, s in zip(t.shape, t.stride()) if n > 1 and s > 0]
    run = es
    inner = next((d for d in dims if d[1] == 1), None)
    if inner is not None:
        dims.remove(inner)
        run = inner[0] * es
    if not dims:
        return [(start, 1, 0, run)]
    count, step = max(dims)  # the longest dimension as the runs of one piece: the fewest pieces
    dims.remove((count, step))
    firsts = [start]
    for n, s in dims:
        if len(firsts) * n > _MAX_PIECES:
            return [(start, 1, 0, sum((n - 1) * s for n, s in zip(t.shape, t.stride())) * es + es)]
        firsts = [f + k * s * es for f in firsts for k in range(n)]
    return [(f, count, step * es, run) for f in firsts]


def _span(r) -> tuple:
    """The first byte and the end of a _runs layout."""
    if type(r) is list:
        spans = [_span(p) for p in r]
        return min(s[0] for s in spans), max(s[1] for s in spans)
    return r[0], r[0] + (r[1] - 1) * r[2] + r[3]


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether any byte of ``a`` is a byte of ``b`` (tensors on one device)."""
    return _runs_overlap(_runs(a), _runs(b))


def first_overlap(out: torch.Tensor, named) -> str | None:
    """The name of the first (name, tensor or None) in ``named`` that shares a byte with ``out``, else None
    (out's layout is read once: the host ops check every input of a call)."""
    ro = _runs(out)
    if ro is None:
        return None
    low, high = _span(ro)  # out's byte span (one call: ~35 ns of an op's 20-45 us of host checks)
    for name, t in named:
        if t is None:
            continue
        # A contiguous input wholly before or after out's span shares nothing (the common case, three reads);
        # the rest is decided run by run. An input of no bytes ends where it starts: apart too.
        start = t.data_ptr()
        if t.is_contiguous() and (start >= high or start + t.nbytes <= low):
            continue
        if _runs_overlap(ro, _runs(t)):
            return name
    return None


def check_out_apart(out: torch.Tensor, named) -> None:
    """Raise ValueError where ``out`` shares a byte with an input of ``named`` (the host ops' check: a kernel
    reading an input while it writes ``out`` would read its own output)."""
    name = first_overlap(out, named)
    if name is not None:
        raise ValueError(f"out overlaps {name}'s memory: the kernel reads {name} while it writes out; "
                         f"pass an out of its own")


def check_in_storage(name: str, t: torch.Tensor) -> None:
    """Raise ValueError naming ``name`` where ``t``'s view reaches past the end of its storage.

    Torch checks a view against its storage when the view is made, not afterwards: a storage shrunk later
    (``untyped_storage().resize_()``, as FSDP frees a parameter's memory) leaves views whose data_ptr points at
    freed or foreign memory, which a kernel would read or write, and torch's own slice assignment and fill_ would
    too. About 0.35 us of host time a contiguous tensor, 0.8 a strided one."""
    # numel, not nbytes: plain torch.compile compiles these checks when a traced call's refusal falls back to eager
    # (a list for a tensor), and a FakeTensor with symbolic sizes has no nbytes (Dynamo's TorchRuntimeError).
    numel = t.numel()
    if not numel:
        return
    es = t.element_size()
    if t.is_contiguous():
        need = (t.storage_offset() + numel) * es
    else:
        end = t.storage_offset() + 1
        for size, stride in zip(t.shape, t.stride()):
            end += (size - 1) * stride
        need = end * es
    have = t.untyped_storage().nbytes()
    if need > have:
        raise ValueError(f"{name}: its view ends at byte {need} of a storage of {have} bytes (the storage was shrunk "
                         f"after the view was made, e.g. by untyped_storage().resize_()); pass a tensor whose "
                         f"storage holds it")


def _runs_overlap(ra, rb) -> bool:
    """Whether two _runs layouts share a byte (None: no bytes)."""
    if ra is None or rb is None:
        return False
    if type(ra) is list or type(rb) is list:  # a layout in pieces (_strided_runs): any piece of each
        return any(_runs_overlap(pa, pb) for pa in (ra if type(ra) is list else [ra])
                   for pb in (rb if type(rb) is list else [rb]))
    if ra[1] > rb[1]:
        ra, rb = rb, ra
    a0, na, sa, la = ra
    b0, nb, sb, lb = rb
    if a0 + (na - 1) * sa + la <= b0 or b0 + (nb - 1) * sb + lb <= a0:
        return False  # the spans are apart: the common case, one comparison
    if na == 1 or sa == 0:
        na, sa = 1, 0
    if nb == 1 or sb == 0:
        nb, sb = 1, 1
    if sa == sb:
        # One row stride (two views of one workspace): run j of b starts d = b0 - a0 + k sb past run i of a, where
        # k = j - i lies in [1 - na, nb - 1]; they share a byte where -lb < d < la. Constant time: the loop below
        # took milliseconds a call for thousands of interleaved rows.
        d = b0 - a0
        lo = max(1 - na, (-lb - d) // sb + 1)
        hi = min(nb - 1, -((d - la) // sb) - 1)
        return lo <= hi
    for i in range(na):
        x = a0 + i * sa
        # runs j of b with b0 + j sb < x + la and b0 + j sb + lb > x
        lo = max(0, (x - lb - b0) // sb + 1)
        hi = min(nb - 1, -((b0 - x - la) // sb) - 1)
        if lo <= hi:
            return True
    return False
