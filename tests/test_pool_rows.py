"""runtime.indexer.topk_pool_rows on the CPU: against its per-element definition (indexer_cases.pool_rows_loop) on
many shapes, the out= path, the keys the mapped rows gather, and every refusal. The CUDA side: test_indexer_gpu.py
(against this CPU result, under a CUDA graph) and test_sparse_mla_gpu.py (the mapped rows fed to sparse_mla_decode).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from indexer_cases import pool_rows_case, pool_rows_loop
from odd_tensors import Storageless, at_byte_offset

from runtime.indexer import topk_pool_rows

I32 = torch.int32

# (rows, pages, width, page_size, table_rows, k): empty ones, page sizes other than 64 (1, odd, larger), a table of
# no pages, widths past k, tables with more rows than the top-k.
SHAPES = [
    (0, 4, 8, 64, None, None),
    (3, 4, 0, 64, None, None),
    (0, 0, 0, 64, None, None),
    (0, 3, 5, 64, 2, None),
    (2, 0, 7, 64, None, None),
    (1, 1, 1, 64, None, None),
    (5, 8, 512, 64, None, None),
    (7, 16, 640, 64, 11, 512),
    (4, 5, 48, 1, None, None),
    (6, 9, 33, 3, 8, None),
    (3, 4, 100, 16, None, 20),
    (2, 3, 300, 128, 5, None),
    (9, 2, 64, 1000, None, 10),
    (4, 6, 40, 2 ** 20, None, None),
]


@pytest.mark.parametrize("rows, pages, width, page_size, table_rows, k", SHAPES)
def test_matches_the_per_element_definition(rows, pages, width, page_size, table_rows, k):
    for seed in range(3):
        topk, table = pool_rows_case(seed, rows, pages, width, page_size, table_rows=table_rows, k=k)
        want = pool_rows_loop(topk, table, page_size)
        got = topk_pool_rows(topk, table, page_size=page_size)
        assert got.dtype == I32 and got.shape == (rows, width) and got.is_contiguous()
        assert torch.equal(got, want)
        if k is not None:
            assert (got[:, k:] == -1).all(), "columns past k hold -1 and stay -1"


def test_the_example_of_each_rule():
    """One row of every rule: on the table (page 0 and 2), -1 and another negative, a position on an unallocated
    page (id -1), the first position past the table, and a row past int32 (-1, not wrapped)."""
    big = (2 ** 31 - 1) // 64  # page id whose rows end at 2^31 - 1 - 63 + 63: the last 64 rows of int32 and more
    table = torch.tensor([[5, -1, 2, big + 1], [7, 0, 3, big]], dtype=I32)
    topk = torch.tensor([[0, 63, 130, -1, -5, 64, 256, 192],
                         [1, 64, 129, 255, 200, 193, -1, 1 << 30]], dtype=I32)
    got = topk_pool_rows(topk, table)
    assert got.tolist() == [[320, 383, 130, -1, -1, -1, -1, -1],
                            [449, 0, 193, big * 64 + 63, big * 64 + 8, big * 64 + 1, -1, -1]]
    assert big * 64 + 63 == 2 ** 31 - 1  # the last int32 row is a row
    assert torch.equal(got, pool_rows_loop(topk, table, 64))
    # Page 2^26 + 1's rows start at 2^32 + 64: -1, where a row computed in int32 would wrap to 64 and look valid
    assert topk_pool_rows(torch.tensor([[5, 63]], dtype=I32), torch.tensor([[2 ** 26 + 1]], dtype=I32)).tolist() \
        == [[-1, -1]]


def test_all_minus_one_and_no_valid_page():
    topk = torch.full((4, 16), -1, dtype=I32)
    table = torch.arange(12, dtype=I32).view(4, 3)
    assert (topk_pool_rows(topk, table) == -1).all()
    topk = torch.arange(64, dtype=I32).repeat(4, 1)
    assert (topk_pool_rows(topk, torch.full((4, 3), -1, dtype=I32)) == -1).all(), "every page unallocated"


def test_strided_inputs_are_read_as_they_are():
    """The indexer buffer's first k columns and a column slice of a wider table are views, not contiguous."""
    topk, table = pool_rows_case(5, 6, 7, 96, 64, table_rows=9)
    wide = torch.full((9, 12), 123, dtype=I32)
    wide[:, 2:9] = table
    view, cols = topk[:, :40], wide[:, 2:9]
    assert not view.is_contiguous() and not cols.is_contiguous()
    assert torch.equal(topk_pool_rows(view, cols), pool_rows_loop(view, table, 64))
    transposed = table.t().contiguous().t()  # column-major
    assert torch.equal(topk_pool_rows(topk, transposed), pool_rows_loop(topk, table, 64))
    # A column-major topk_indices gives a contiguous result, as the kernel's (sparse_mla_decode takes no other)
    got = topk_pool_rows(topk.t().contiguous().t(), table)
    assert got.is_contiguous() and torch.equal(got, pool_rows_loop(topk, table, 64))


def test_the_rows_gather_each_rows_own_keys():
    """What the mapping is for: a pool whose pages hold each request's compressed keys in its table's order gives,
    at the mapped rows, the keys of the positions (a per-request dense copy indexed by position)."""
    g = torch.Generator().manual_seed(0)
    rows, pages, page_size, dim = 5, 4, 16, 8
    pool_pages = rows * pages + 3
    perm = torch.randperm(pool_pages, generator=g)[:rows * pages].view(rows, pages).to(I32)
    pool = torch.randn(pool_pages * page_size, dim, generator=g)
    seq_lens = torch.randint(1, pages * page_size + 1, (rows,), generator=g)
    table = perm.clone()
    for r in range(rows):  # pages past the row's length unallocated
        table[r, -(-int(seq_lens[r]) // page_size):] = -1
    dense = [pool.view(pool_pages, page_size, dim)[perm[r].long()].reshape(-1, dim) for r in range(rows)]
    topk = torch.full((rows, 24), -1, dtype=I32)
    for r in range(rows):
        n = min(20, int(seq_lens[r]))
        topk[r, :n] = torch.randperm(int(seq_lens[r]), generator=g)[:n].to(I32)
    mapped = topk_pool_rows(topk, table, page_size=page_size)
    assert torch.equal(mapped < 0, topk < 0)
    for r in range(rows):
        n = int((topk[r] >= 0).sum())
        assert torch.equal(pool[mapped[r, :n].long()], dense[r][topk[r, :n].long()])


def test_out_is_written_and_returned():
    topk, table = pool_rows_case(1, 4, 5, 70, 64)
    want = pool_rows_loop(topk, table, 64)
    out = torch.full_like(topk, 77)
    assert topk_pool_rows(topk, table, out=out) is out
    assert torch.equal(out, want)
    rows = torch.full((6, 70), 77, dtype=I32)
    assert topk_pool_rows(topk, table, out=rows[1:5]) is not None  # a slice of a buffer's rows is contiguous
    assert torch.equal(rows[1:5], want) and (rows[0] == 77).all() and (rows[5] == 77).all()


def test_out_may_be_the_compressed_columns_of_sparse_mla_indices():
    """Rows of consecutive columns, apart: sparse_mla_decode's indices[:, 128:] takes the map directly (no copy);
    the sliding-window columns stay as they were."""
    topk, table = pool_rows_case(5, 4, 6, 512, 64)
    indices = torch.full((4, 640), 77, dtype=I32)
    assert topk_pool_rows(topk, table, out=indices[:, 128:]) is not None
    assert torch.equal(indices[:, 128:], pool_rows_loop(topk, table, 64)) and (indices[:, :128] == 77).all()


def test_pdl_takes_a_bool_only():
    _refused(TypeError, ["pdl"], *_args(), pdl="False")
    topk, table = _args()
    assert torch.equal(topk_pool_rows(topk, table, pdl=False), pool_rows_loop(topk, table, 64))


def test_out_may_be_topk_indices_in_place():
    """The result is computed whole before out is written: out=topk_indices maps in place, and an out that shares
    part of topk_indices' memory (shifted by a row) gets the same values as one of its own."""
    topk, table = pool_rows_case(2, 5, 6, 50, 64)
    want = pool_rows_loop(topk, table, 64)
    same = topk.clone()
    assert topk_pool_rows(same, table, out=same) is same
    assert torch.equal(same, want)
    buf = torch.empty(6, 50, dtype=I32)
    buf[1:].copy_(topk)
    topk_pool_rows(buf[1:], table, out=buf[:5])
    assert torch.equal(buf[:5], want)


def test_out_made_under_inference_mode():
    topk, table = pool_rows_case(3, 3, 4, 20, 64)
    with torch.inference_mode():
        out = torch.empty(3, 20, dtype=I32)
    topk_pool_rows(topk, table, out=out)
    assert torch.equal(out, pool_rows_loop(topk, table, 64))


def test_no_value_is_read_on_the_host():
    """The meta device holds shapes without values: a read of a value on the host (.item(), a branch on a tensor)
    raises there, so a run on it shows that the map reads none, as a CUDA graph's capture needs."""
    topk = torch.empty(4, 64, dtype=I32, device="meta")
    table = torch.empty(6, 8, dtype=I32, device="meta")
    got = topk_pool_rows(topk, table, page_size=16)
    assert got.device.type == "meta" and got.shape == (4, 64) and got.dtype == I32
    out = torch.empty(4, 64, dtype=I32, device="meta")
    assert topk_pool_rows(topk, table, out=out) is out


# Profiler events that launch no kernel of their own on a GPU: views, allocations, wrappers that dispatch to the op
# doing the work (a cast's copy_, the & operator's bitwise_and).
NO_KERNEL = {"aten::slice", "aten::as_strided", "aten::to", "aten::_to_copy", "aten::empty", "aten::empty_strided",
             "aten::scalar_tensor", "aten::__and__"}


def _elementwise_kernels(fn) -> list[str]:
    """The ops ``fn`` runs that would each be a kernel on a GPU, from the CPU profiler: every aten op but views,
    allocations and wrappers (what they dispatch to counts), an op that dispatches to one of its own name (where
    with a scalar) counted once."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::") and e.name not in NO_KERNEL
            and not any(child.name == e.name for child in e.cpu_children)]


@pytest.mark.parametrize("with_out", [False, True])
def test_the_map_is_thirteen_kernels_at_most(with_out):
    """The map runs between the indexer and sparse_mla_decode in every layer, where each small elementwise kernel
    costs about a launch: it was seventeen (three compares and three ands for its masks, a multiply and an add for
    the row); it is thirteen (the mask of positions on the table is one clamp and one compare, the row one add with
    alpha, past-int32 one compare and fill). The CPU profiler counts what a GPU would launch."""
    topk, table = pool_rows_case(0, 12, 64, 512, 64)
    out = torch.empty_like(topk) if with_out else None
    kernels = _elementwise_kernels(lambda: topk_pool_rows(topk, table, out=out))
    assert "aten::gather" in kernels and len(kernels) <= 13, kernels


def test_page_size_takes_any_integer_type():
    topk, table = pool_rows_case(4, 3, 4, 30, 32)
    want = pool_rows_loop(topk, table, 32)
    for page_size in (np.int64(32), torch.tensor(32)):
        assert torch.equal(topk_pool_rows(topk, table, page_size=page_size), want)


# ---------------------------------------------------------------------------
# Refusals: each names the argument, before anything is computed
# ---------------------------------------------------------------------------

def _args(rows=3, width=8, pages=4):
    topk, table = pool_rows_case(0, rows, pages, width, 64)
    return topk, table


def _refused(kind, words, *args, **kw):
    with pytest.raises(kind) as e:
        topk_pool_rows(*args, **kw)
    for word in words:
        assert word in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize("bad, kind, words", [
    ([[0, 1]], TypeError, ["topk_indices", "torch.Tensor"]),
    (torch.zeros(3, 8, dtype=torch.int64), TypeError, ["topk_indices", "int32", "topk_indices.int()"]),
    (torch.zeros(3, 8), TypeError, ["topk_indices", "float32"]),
    (torch.zeros(24, dtype=I32), ValueError, ["topk_indices", "2-D"]),
    (torch.zeros(3, 8, 1, dtype=I32), ValueError, ["topk_indices", "2-D"]),
    (torch.zeros(3, 8, dtype=I32).to_sparse(), TypeError, ["topk_indices", "dense"]),
    (at_byte_offset(torch.zeros(3, 8, dtype=I32), 2), ValueError, ["topk_indices", "aligned"]),
    (Storageless(torch.zeros(3, 8, dtype=I32)), TypeError, ["topk_indices", "memory"]),
])
def test_refuses_topk_indices(bad, kind, words):
    _, table = _args()
    _refused(kind, words, bad, table)


@pytest.mark.parametrize("bad, kind, words", [
    (None, TypeError, ["block_table", "torch.Tensor"]),
    (torch.zeros(3, 4, dtype=torch.int64), TypeError, ["block_table", "int32", "block_table.int()"]),
    (torch.zeros(12, dtype=I32), ValueError, ["block_table", "2-D"]),
    (torch.zeros(2, 4, dtype=I32), ValueError, ["block_table", "2 rows", "3"]),
    (torch.zeros(3, 4, dtype=I32, device="meta"), ValueError, ["block_table", "meta", "one device"]),
])
def test_refuses_block_table(bad, kind, words):
    topk, _ = _args()
    _refused(kind, words, topk, bad)


def test_refuses_a_shrunk_storage():
    topk, table = _args()
    table = table.clone()
    view = table[:]
    table.untyped_storage().resize_(0)
    _refused(ValueError, ["block_table", "storage"], topk, view)


@pytest.mark.parametrize("bad, kind, words", [
    (True, TypeError, ["page_size", "bool"]),
    (64.0, TypeError, ["page_size", "float"]),
    ("64", TypeError, ["page_size", "str"]),
    (None, TypeError, ["page_size"]),
    (0, ValueError, ["page_size", ">= 1"]),
    (-64, ValueError, ["page_size", ">= 1"]),
    (2 ** 31, ValueError, ["page_size", "2^31 - 1"]),
])
def test_refuses_page_size(bad, kind, words):
    _refused(kind, words, *_args(), page_size=bad)


def test_refuses_page_size_on_the_device_before_reading_it():
    """A tensor off the CPU would be read back (a device sync, or a failure inside a capture): named, not read."""
    page_size = torch.tensor(64, device="meta")
    _refused(TypeError, ["page_size", "Python int"], *_args(), page_size=page_size)


@pytest.mark.parametrize("make_out, kind, words", [
    (lambda t, b: t.tolist(), TypeError, ["out", "torch.Tensor"]),
    (lambda t, b: t.long(), TypeError, ["out", "int32", "dtype=torch.int32"]),
    (lambda t, b: t.clone().view(-1), ValueError, ["out", "2-D"]),
    (lambda t, b: torch.zeros(3, 9, dtype=I32), ValueError, ["out", "(3, 9)", "(3, 8)"]),
    (lambda t, b: torch.zeros(4, 8, dtype=I32), ValueError, ["out", "torch.empty(topk_indices.shape"]),
    (lambda t, b: torch.zeros(8, 3, dtype=I32).t(), ValueError, ["out", "strides (1, 3)", "consecutive"]),
    (lambda t, b: torch.zeros(3, 16, dtype=I32)[:, ::2], ValueError, ["out", "strides (16, 2)", "consecutive"]),
    (lambda t, b: torch.zeros(40, dtype=I32).as_strided((3, 8), (4, 1)), ValueError, ["out", "(4, 1)", "overlap"]),
    (lambda t, b: torch.zeros(3, 8, dtype=I32, device="meta"), ValueError, ["out", "meta", "device"]),
    (lambda t, b: b.view(-1)[:24].view(3, 8), ValueError, ["out", "block_table", "out=topk_indices"]),
])
def test_refuses_out(make_out, kind, words):
    topk, _ = _args()
    table = torch.randint(0, 50, (6, 4), dtype=I32)  # 24 elements: an out of topk's shape fits over it
    before = topk.clone(), table.clone()
    out = make_out(topk, table)
    _refused(kind, words, topk, table, out=out)
    assert torch.equal(topk, before[0]) and torch.equal(table, before[1]), "refused before anything is written"


def test_refusal_comes_before_any_write():
    """A bad page_size with a good out: out keeps its values."""
    topk, table = _args()
    out = torch.full_like(topk, 77)
    _refused(ValueError, ["page_size"], topk, table, page_size=0, out=out)
    assert (out == 77).all()
