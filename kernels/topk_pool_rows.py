"""The ``topk_pool_rows`` kernel: the indexer's top-k positions mapped to paged-pool rows (see
runtime/contract/topk_pool_rows.py for the grid, the parameters and the rule).

One launch replaces the chain of torch elementwise kernels the host op ran (thirteen launches between the top-k
kernel and sparse_mla_decode in every layer). Each thread maps one column: a load of the position, at most one
gather from the block table, one store. A position off the table never reaches the gather, so no input makes the
kernel read outside the rows and pages it was given.
"""

from __future__ import annotations

from cutlass import Int32, Int64, cute

from runtime.contract import topk_pool_rows as contract

from . import ptx
from .compile import contract_pointers, cubin_of, null_stream

INT32_MAX = 2 ** 31 - 1


class TopkPoolRows:
    def __init__(self, threads: int):
        self.threads = threads

    @cute.jit
    def __call__(self, topk: cute.Pointer, table: cute.Pointer, out: cute.Pointer, topk_row_stride: Int64,
                 topk_col_stride: Int64, table_row_stride: Int64, table_col_stride: Int64, out_row_stride: Int64,
                 width: Int32, pages: Int32, page_size: Int32, stream):
        # The runtime sets the grid (rows, column blocks).
        self.kernel(topk, table, out, topk_row_stride, topk_col_stride, table_row_stride, table_col_stride,
                    out_row_stride, width, pages, page_size).launch(grid=[1, 1, 1], block=[self.threads, 1, 1],
                                                                    stream=stream)

    @cute.kernel
    def kernel(self, topk: cute.Pointer, table: cute.Pointer, out: cute.Pointer, topk_row_stride: Int64,
               topk_col_stride: Int64, table_row_stride: Int64, table_col_stride: Int64, out_row_stride: Int64,
               width: Int32, pages: Int32, page_size: Int32):
        tid, _, _ = cute.arch.thread_idx()
        row, block, _ = cute.arch.block_idx()
        col = Int32(block) * self.threads + Int32(tid)
        r = Int64(row)
        # The positions come from the previous grid (the top-k kernel); nothing global is touched before the wait.
        # The next grid (sparse_mla_decode) waits for this one's completion in its own griddepcontrol.wait, so it
        # may start its prologue now.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        if col < width:
            pos = ptx.ld_global_s32(topk.toint() + (r * topk_row_stride + Int64(col) * topk_col_stride) * 4)
            mapped = Int32(-1)
            if pos >= 0:
                page = pos // page_size
                if page < pages:
                    page_id = ptx.ld_global_s32(table.toint() + (r * table_row_stride + Int64(page) * table_col_stride)
                                                * 4)
                    if page_id >= 0:
                        # In int64: a page id times the page size may pass int32, and such a row maps to -1.
                        row_in_pool = Int64(page_id) * Int64(page_size) + Int64(pos - page * page_size)
                        if row_in_pool <= Int64(INT32_MAX):
                            mapped = Int32(row_in_pool)
            ptx.st_global_b32(out.toint() + (r * out_row_stride + Int64(col)) * 4, mapped)


def compile_variant(variant, arch: str) -> bytes:
    assert variant.threads == contract.THREADS
    op = TopkPoolRows(variant.threads)
    ptrs = contract_pointers(contract, dict.fromkeys(contract.POINTER_ALIGN, Int32))
    strides = [Int64(0), Int64(1), Int64(0), Int64(1), Int64(0)]
    return cubin_of(op, *ptrs, *strides, Int32(0), Int32(0), Int32(1), null_stream(), arch=arch)
