"""decode_topk: exact top-k of indexer logits per row, token and block mode.

One launch handles ``rows`` rows; each row is split over the ``cluster`` CTAs of
one thread-block cluster (grid x = rows * cluster), or, in the short-row variants
(``_row``), taken by one CTA (grid x = rows). Kernel parameters:

- ``logits``: ``[rows, stride]`` FP32 or BF16, 16-byte aligned, ``stride`` in elements
  (a multiple of 16 bytes), ``width`` valid allocated columns (``logits.shape[1]``);
- ``row_ends``: int32 ``[rows]``; the kernel clips each to ``[0, width]``;
- ``out``: int32 ``[rows, out_stride]``; the kernel writes columns ``[0, k)`` of each row.

Token mode selects column indices; block mode selects indices of the blocks
``[8b, 8b + 8)`` (clipped to the row end), each scored by its maximum. The selected
set is exact: largest keys first, ties at the threshold to the lower index, NaN as
-inf; with fewer candidates than ``k`` the row gets every candidate (in index order)
then -1. Within a row the order is unspecified (not sorted).

``k`` is a runtime argument (any value in ``SUPPORTED_K``); nothing in shared memory
is sized by it.
"""

from . import Variant, params

PARAMS = params(
    "void* logits",
    "void* row_ends",
    "void* out",
    "int32_t width",
    "int32_t stride",
    "int32_t out_stride",
    "int32_t k",
)
# The bytes the host op guarantees for each pointer's start: logits off 16 bytes take the exact fallback, row_ends
# and out are checked for their element size alone (runtime.topk). The most the kernel may declare at compile.
POINTER_ALIGN = {"logits": 16, "row_ends": 4, "out": 4}

THREADS = 512
CLUSTERS = (1, 2, 4, 8, 16)
DTYPES = ("f32", "bf16")
SUPPORTED_K = (512, 1024, 2048)
BLOCK_SIZE = 8  # columns per candidate block in block mode

# Shared memory per CTA: two 2048-bin histograms (16 KiB), a scan scratch and a
# few words (misc, per-warp counts, the 48 words the peers store), the candidate
# list of (key, index) pairs, and two mbarriers (16 bytes, last). 111 KiB
# lets two CTAs share an SM (233,472 B per SM on sm_90a/sm_100a, 1 KiB of it
# reserved per CTA).
HIST_BINS = 2048
LIST_CAPACITY = 12032


def smem_bytes_for(list_capacity: int) -> int:
    return 2 * HIST_BINS * 4 + 2 * 32 * 4 + 16 * 4 + 32 * 4 + 48 * 4 + list_capacity * 8 + 16


SMEM_BYTES = smem_bytes_for(LIST_CAPACITY)
# The twins (one CTA an SM, shared memory to spare) hold a longer list, while a warp still refreshes its bound
# whenever its segment passes LIST_CAPACITY's share: the rest is headroom for a warp whose refresh frees too
# little, which otherwise gives up its list and has its CTA re-read the slice. That happens where a warp ends its
# part of a long slice ahead of the others, while the CTA's k-th largest so far still sits a bin low: at k 2048 on
# 512K-column slices (64 x 1M FP32 on the 2-CTA twin) the H100 took 175-201 us against 116 us at k 1024
# (topk_cell_probe_s55_h100.json); an emulation of the warp loop (benchmarks/step1_list_emulation.py) overflows
# 7-29 of 40 such CTAs at a 20-50 % spread of the warps' speeds with 752 slots a warp, none with 1024.
TWIN_LIST_CAPACITY = 16384
# Clusters of this many CTAs or more serve few rows (one wave holds few of them anyway):
# they are compiled for one CTA an SM, so up to 128 registers a thread instead of the 64
# that two CTAs an SM allow. Measured on the H200 (decode_topk_ab_h200.json: regs_ab):
# 0.2-0.55 us faster on every 8- and 16-CTA case; one wave then holds 16 clusters of 8
# (was 30) and 8 of 16 (was 14). Twice the list as well was slower (fewer bound refreshes
# let more items through: 8 x 256K k512 19.9 -> 27.1 us; wide_list_ab).
ONE_CTA_PER_SM_MIN_CLUSTER = 8
# The smaller clusters in this tuple have a twin compiled for one CTA an SM as well ("_full_sm": 128 registers
# and step 1's table), which the host op takes for long slices wherever one wave of it holds the rows (half as
# many as the two-CTA build's; runtime/topk.py: FULL_SM_TWIN_MIN_COLUMNS). Measured on the H200
# (decode_topk_ab_h200.json: full_sm_twin_ab): 2 CTAs a row, 64 x 64K 19.1 -> 15.5 us (FP32 k512), 21.2 -> 14.6 us
# (BF16 k2048), 64 x 256K BF16 k512 34.5 -> 29.2 us, 32 x 128K FP32 k2048 28.5 -> 22.1 us; 4 CTAs a row, 16 x 256K
# FP32 k2048 29.4 -> 22.9 us, 24 x 256K BF16 k512 23.7 -> 17.8 us, but 0.1-0.2 us slower on 4K-column slices
# (1 and 8 x 16K). One CTA a row: mixed (128 x 64K BF16 23.8 -> 19.4 us, 100 x 256K FP32 58.4 -> 60.6 us), no twin.
# Token mode only: block mode has no table, and its twins were not measured.
FULL_SM_TWIN_CLUSTERS = (2, 4)

# Step 1 (the one read of the logits) runs by CTA-wide tiles (a histogram only; the later
# steps re-read the slice), or, from this many 8-column groups per CTA on, by independent
# warps on contiguous parts of the slice with a float-compare prefilter and a candidate list.
# Measured on the H200 (gpu/jobs/topk_roots.py, one process, committed vs candidate builds;
# benchmarks/results/decode_topk_ab_h200.json: listless_ab): with the tiles' list gone, token
# mode's tiles win up to 32K columns per CTA (1 x 256K on 16 CTAs, k2048: 18.6 -> 16.0 us; BF16
# k512 16.1 -> 14.2 us) and lose from there (8 x 256K on 8 CTAs: 18.4 -> 20.6 us with 8192);
# block mode's tiles lose at 16K columns (8 x 64K on 4 CTAs +0.4-0.5 us), as before (routing_ab).
WARP_STEP1_MIN_GROUPS = {"token": 4096, "block": 2048}
# On the variants compiled for one CTA an SM (shared memory to spare), token mode's CTA tiles go up to
# STEP1_TABLE_TILES tiles a CTA (128K columns), and step 1 records, per 8-column group, the first digit of its
# largest key (a half-word each, in an array of its own): the later steps re-read only the groups that
# can hold the row's threshold bin or above (k / cluster items and the bin's share of the slice).
# Measured on the H200 (decode_topk_ab_h200.json: step1_table_ab): 2-4 us faster on 256K-1M rows of 1-14
# rows (1 x 1M FP32 k2048 28.1 -> 25.0 us, 8 x 256K BF16 k512 18.6 -> 14.5), within 0.2 us elsewhere but
# 14 x 1M FP32 (+0.8/+2.2 us; 16 tiles instead: no change there, and 8 x 1M 2 us slower than with 32).
# The 2-CTA-an-SM variants keep the warp loop from 4096 groups and re-read whole slices: the table would
# take the list's room for the threshold bin (at k 2048 the cluster-wide finish then ran, 3x slower).
STEP1_TABLE_TILES = 32
# With the table, 1 KiB of counts of the groups' maxima around the threshold bin (kernels/decode_topk/common.py:
# REFINE_WINDOW_BINS, used by the FP32 variants of 2 to 8 CTAs).
STEP1_TABLE_BYTES = STEP1_TABLE_TILES * THREADS * 2 + 1024
# The table serves every launch size: the largest a wave holds is 64 MiB (64 x 256K FP32 on the 2-CTA twin, 32 x 512K
# on the 4-CTA one). It was held to launches of at most 60 MiB while step 1 prefetched whole FP32 slices into L2 (then
# the warp loop won at 64 MiB: full_sm_twin_ab); without that prefetch (since then a few tiles ahead instead, and FP32
# tiles by bulk copies: kernels/decode_topk/common.py, STEP1_PREFETCH_AHEAD, STEP1_BULK_BYTES) the table is faster
# there
# (decode_topk_ab_h200.json: table_gate_ab):
# 64 x 256K FP32 k512 35.3 -> 29.2 us, k2048 39.4 -> 36.1 us, 32 x 512K k2048 on 4 CTAs 71.4 -> 50.5 us.


def step1_table_tiles(block_mode: bool, ctas_per_sm: int) -> int:
    return 0 if block_mode or ctas_per_sm > 1 else STEP1_TABLE_TILES


def warp_step1_min_groups(block_mode: bool, ctas_per_sm: int) -> int:
    """Where the warp loop takes over from the CTA tiles: past the table's tiles where there is one."""
    tiles = step1_table_tiles(block_mode, ctas_per_sm)
    return tiles * THREADS + 1 if tiles else WARP_STEP1_MIN_GROUPS["block" if block_mode else "token"]


# The short-row variant: one CTA a row (no cluster), the whole row read once into registers
# (ROW_GROUPS_PER_THREAD 8-column groups a thread); the first digit's bin goes to a list of
# (key, index) pairs that holds every item of the row (all-equal rows), for the gathered finish.
# Rows of up to ROW_MAX_WIDTH allocated columns (launched with a wider width it reads, and selects
# from, only the first ROW_MAX_WIDTH columns; the host op never does); compiled for one CTA an SM
# (128 registers), so one wave holds one row an SM.
ROW_GROUPS_PER_THREAD = 4
ROW_MAX_WIDTH = THREADS * ROW_GROUPS_PER_THREAD * 8


def row_list_capacity(block_mode: bool) -> int:
    return ROW_MAX_WIDTH // BLOCK_SIZE if block_mode else ROW_MAX_WIDTH


def row_smem_bytes(block_mode: bool) -> int:
    return 2 * HIST_BINS * 4 + 2 * 32 * 4 + 16 * 4 + row_list_capacity(block_mode) * 8


def has_full_sm_twin(block_mode: bool, cluster: int) -> bool:
    return cluster in FULL_SM_TWIN_CLUSTERS and not block_mode


def name_for(dtype: str, block_mode: bool, cluster: int, full_sm: bool = False) -> str:
    """The cluster kernel's name; full_sm: the twin compiled for one CTA an SM (FULL_SM_TWIN_CLUSTERS)."""
    twin = "_full_sm" if full_sm else ""
    return f"decode_topk_{dtype}_{'block' if block_mode else 'token'}_c{cluster}{twin}"


def row_name_for(dtype: str, block_mode: bool) -> str:
    return f"decode_topk_{dtype}_{'block' if block_mode else 'token'}_row"


def _variant(dtype: str, block_mode: bool, cluster: int, full_sm: bool = False) -> Variant:
    ctas_per_sm = 1 if full_sm or cluster >= ONE_CTA_PER_SM_MIN_CLUSTER else 2
    table_tiles = step1_table_tiles(block_mode, ctas_per_sm)
    list_capacity = TWIN_LIST_CAPACITY if full_sm else LIST_CAPACITY
    return Variant(
        family="decode_topk",
        name=name_for(dtype, block_mode, cluster, full_sm),
        params=PARAMS,
        threads=THREADS,
        cluster=(cluster, 1, 1),
        smem_bytes=smem_bytes_for(list_capacity) + (STEP1_TABLE_BYTES if table_tiles else 0),
        pdl=True,
        config=(
            ("kind", "cluster"),
            ("dtype", dtype),
            ("block_mode", block_mode),
            ("cluster", cluster),
            ("ctas_per_sm", ctas_per_sm),
            ("list_capacity", list_capacity),
            ("list_refresh_capacity", LIST_CAPACITY),
            ("hist_bins", HIST_BINS),
            ("warp_step1_min_groups", warp_step1_min_groups(block_mode, ctas_per_sm)),
            ("step1_table_tiles", table_tiles),
        ),
    )


def _row_variant(dtype: str, block_mode: bool) -> Variant:
    return Variant(
        family="decode_topk",
        name=row_name_for(dtype, block_mode),
        params=PARAMS,
        threads=THREADS,
        smem_bytes=row_smem_bytes(block_mode),
        pdl=True,
        config=(
            ("kind", "row"),
            ("dtype", dtype),
            ("block_mode", block_mode),
            ("cluster", 1),
            ("ctas_per_sm", 1),
            ("hist_bins", HIST_BINS),
            ("groups_per_thread", ROW_GROUPS_PER_THREAD),
            ("list_capacity", row_list_capacity(block_mode)),
            ("max_width", ROW_MAX_WIDTH),
        ),
    )


CLUSTER_VARIANTS = tuple(
    _variant(dtype, block_mode, cluster, full_sm)
    for dtype in DTYPES
    for block_mode in (False, True)
    for cluster in CLUSTERS
    for full_sm in ((False, True) if has_full_sm_twin(block_mode, cluster) else (False,))
)
ROW_VARIANTS = tuple(_row_variant(dtype, block_mode) for dtype in DTYPES for block_mode in (False, True))
VARIANTS = CLUSTER_VARIANTS + ROW_VARIANTS
