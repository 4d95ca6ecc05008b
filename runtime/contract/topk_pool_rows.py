"""topk_pool_rows: the indexer's top-k positions mapped to rows of a paged pool, in one kernel.

Grid ``(rows, ceil(width / THREADS))``: CTA ``(r, b)`` maps columns ``[b * THREADS, (b + 1) * THREADS)`` of row
``r``, one column a thread. Position ``p`` of row ``r`` becomes ``block_table[r, p // page_size] * page_size +
p % page_size``; -1 where ``p`` is negative, at or past ``pages * page_size``, on a page of negative id, or where
the row exceeds 2^31 - 1 (``runtime.indexer.topk_pool_rows``' rule). Kernel parameters:

- ``topk_indices``: int32, read at ``r * topk_row_stride + c * topk_col_stride`` (elements; any strided view);
- ``block_table``: int32, read at ``r * table_row_stride + page * table_col_stride`` for ``page < pages`` only;
- ``out``: int32, written at ``r * out_row_stride + c`` (unit column stride: a buffer's rows, or the compressed
  columns of ``sparse_mla_decode``'s indices); each thread reads its column before writing it, so ``out`` may be
  ``topk_indices`` itself (in place), never a view that overlaps it otherwise.

Launched with programmatic dependent launch: it waits for the previous grid (the top-k kernel writes its input)
before any global access, and releases its dependents (``sparse_mla_decode``'s prologue) at once.
"""

from . import Variant, params

PARAMS = params(
    "void* topk_indices",
    "void* block_table",
    "void* out",
    "int64_t topk_row_stride",
    "int64_t topk_col_stride",
    "int64_t table_row_stride",
    "int64_t table_col_stride",
    "int64_t out_row_stride",
    "int32_t width",
    "int32_t pages",
    "int32_t page_size",
)
# The bytes the host op guarantees for each pointer's start (element alignment: runtime.indexer.topk_pool_rows), the
# most the kernel may declare at compile.
POINTER_ALIGN = {"topk_indices": 4, "block_table": 4, "out": 4}

THREADS = 256
NAME = "topk_pool_rows"

VARIANTS = (
    Variant(
        family="topk_pool_rows",
        name=NAME,
        params=PARAMS,
        threads=THREADS,
        pdl=True,
        config=(("columns_per_cta", THREADS),),
    ),
)
