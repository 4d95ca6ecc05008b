"""decode_topk kernels: exact radix select of each row's k largest logits (contract: runtime/contract/decode_topk.py).

A row is split into equal slices of 8-column groups over the CTAs of a cluster.
Each logit becomes an order-preserving unsigned key (NaN -> key of -inf, -0 -> +0),
so "larger key" is "larger value" and one integer compare decides every tie.

Step 1  every CTA reads its slice once (16-byte loads, two iterations ahead) into a 2048-bin
        histogram of the key's top 11 bits. A short slice (under warp_min_groups groups) goes
        by CTA-wide tiles (past two tiles in token mode binned by the raw bits' top 11, the bins
        put in key order after the loop: raw_group_bins) and keeps nothing else: its later steps
        re-read it, or, on the variants with a table (one CTA an SM, token mode; up to 128K
        columns a CTA), only the groups whose largest key's top 16 bits (a half-word a group,
        recorded here) reach the row's floor: the threshold bin's, or on 2-8 CTAs the sub-bin
        that enough groups' maxima reach (refined_floor) (gather_marked: a bitmask of the marked
        tiles a lane, packed lane by lane, re-read 32 groups a warp at a time). FP32 slices past
        two tiles come through shared memory by bulk copies, five tiles in flight (step1_tiles_bulk);
        BF16 ones are requested into L2 two tiles ahead of their loads; shorter ones whole. A
        long slice goes by warps, each on its own contiguous part, and also
        keeps a shared-memory list (a segment per warp, packed at the end), in index order, of
        (key, column) of the items that can still be selected. An item whose top bits are
        below the bin of the CTA's own k-th largest so far (the bound) cannot be among the
        row's k largest: it is neither counted nor listed. The test is one float compare per
        item; the items that pass are written in order (their places from one ballot per bit
        of the lanes' counts, not a shuffle scan) and read back densely for their exact key
        and the histogram. A warp refreshes its bound (and filters its segment) when the
        segment cannot take another iteration; in token mode on 1- and 16-CTA clusters the
        warps also share a bound that one warp in 16 recomputes each iteration; at the end the
        segments keep only the items at or above the CTA's final k-th bin. A CTA whose list
        still overflows (many equal keys) re-reads its slice in the later steps too.
Step 2  the cluster sums the histograms through distributed shared memory (from the
        highest of the CTAs' final bounds up to the highest nonempty bin of any CTA: the
        bins it reads are exact) and every CTA finds the same bin holding the k-th largest
        key (and, from the same reads, how many of that bin's items the lower-ranked CTAs hold).
Gathered finish (when that bin's items fit behind CTA 0's list): every CTA pushes its
        items in the bin to CTA 0 (DSMEM stores, coalesced: ballots place them; on 16
        CTAs, and from a CTA without a list on 8 too, staged first and copied densely; on 8
        and 16 CTAs by st.async onto an mbarrier of CTA 0, the cluster barrier then relaxed)
        and reserves output slots for its items above the bin with adds on the row's
        counter in CTA 0 (a listed CTA: one per warp, on 16 CTAs one per CTA, and writes
        them after one cluster barrier's arrive; a short
        slice, from its register-resident keys or a re-read of the slice: one per CTA);
        CTA 0 alone selects among the bin's items by
        block-local radix rounds over the remaining key bits, then over the inverted
        index (exact ties go to the lower index; up to TIE_RANK_MAX ties are ranked
        directly instead), and writes them. Where refined_floor applies (CTA-tile slices on 2-8 CTAs,
        one barrier after a pass over the table; on full FP32 launches of long slices, the counts step 1 kept
        in a window around the bin instead: refine_window), only the bin's items from its floor up are taken:
        staged at the end of each CTA's own list, then copied behind one add on CTA 0's counter.
        BF16 token mode on 8 and 16 CTAs, where every CTA ran step 1
        by tiles and can stage its items of the bin (finish_low_bits): no pushes and no finish on CTA 0; the
        cluster resolves the key's last 5 bits from a 32-bin histogram of every stage, each CTA writes its own
        selected items, and ties of the resolved key are cut by rank (lower ranks hold lower columns).
        Otherwise:
Step 2' (cluster-wide finish) the remaining digits
        (8 + 8 + 5 bits for FP32, 5 for BF16; only 2**bits bins are exchanged) are
        selected the same way over the list. Selection stops early once the k-th item
        is the last of its bin. This leaves a threshold (key & mask == prefix) and how
        many items equal to it the row still needs (all of them after an early stop).
Step 3  keys above the threshold are written at this CTA's block of slots (one atomic
        add on a counter in CTA 0 of the cluster); keys equal to it fill the remaining
        slots in index order: a CTA takes its share from the prefix of the equal counts
        of lower-ranked CTAs (lower columns), and inside the CTA an ordered scan ranks
        them when not all are taken.

Rows with at most k candidates skip the selection: their candidates in index
order, then -1. Output order within a row is unspecified.

Every variant is launched with programmatic dependent launch: the shared-memory zeroing
runs while the previous grid finishes, griddepcontrol.wait comes before any global
access (wait_for_inputs), and the next grid may start once step 1 is done.

DecodeTopKRow (the `_row` variants, rows of up to 16K columns) is one CTA a row: the row
is read once into registers, the first digit is selected there, and the gathered finish
above resolves its bin; no cluster, no list of step 1, no re-read.
"""

from __future__ import annotations

import functools
import os

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr
from cutlass.memory.smem import SmemAllocator

from runtime.contract import decode_topk as contract

from . import ptx
from .compile import cubin_of, gmem_ptr, null_stream

WARP = 32
# Consecutive list slots a lane reads at once (vector loads) in the end-of-step-1 segment
# filter; the segment capacity is a multiple of it.
LIST_VEC = 8
# List slots a thread takes per iteration of the gather pass (T apart).
GATHER_VEC = 8
# Gathered items a thread takes per iteration of the gathered finish's selection pass (T apart) in the
# variants compiled for one CTA an SM (128 registers): one output-slot add per warp and iteration for all
# of them, so the chains' latencies overlap. Measured on the H200 (decode_topk_ab_h200.json:
# select_vec_ab): 4 is 0.1-0.75 us faster on 8 and 16 CTAs (1 x 1M k2048 28.52 -> 28.00 us), 8 slower;
# on 1, 2 and 4 CTAs (64 registers) 4 was 0.1-0.25 us slower, so they take one item an iteration.
SELECT_VEC = 4
# A CTA-tile slice of one or two tiles is requested into L2 whole at the start of step 1, one
# bulk prefetch of this many bytes a thread: its tiles then wait on L2, not DRAM (measured on
# the H200: 0.2-0.6 us faster; a running prefetch ahead of the warp loop was 1-3 us slower on
# long slices, so the warp loop has none; longer CTA-tile slices: STEP1_PREFETCH_AHEAD).
PREFETCH_PIECE_BYTES = 4096
# On clusters of at least GATHER_STAGE_MIN_CLUSTER CTAs, the gathered finish's pushes are staged (then
# copied to CTA 0 densely) when the CTA's items of the threshold bin fit GATHER_STAGE (key, index)
# pairs: the second histogram buffer, unused by then. Measured on the H200 (decode_topk_ab_h200.json:
# staged_pushes_ab): 0.03-0.57 us faster on 16 CTAs, 0.1-0.56 us slower on 1 to 8 (the extra barrier
# and copy outweigh the sparse DSMEM stores there).
GATHER_STAGE = 1024
# Where a CTA's slice is two tiles still in registers after step 1 (one CTA an SM, with a step-1 table no longer read
# by then), the gathered finish's pass keeps a mask of the thread's items at or above the threshold bin and its keys
# in the table's room, then takes only the masked items, lowest first (split_candidates), instead of one predicated
# sequence for each of its 16 items (~190 instructions a warp, most of them for items below the bin). Measured on the
# H200 (decode_topk_ab_h200.json: sparse_split_s30_ab): 8 x 64K on 8 CTAs 0.1-0.14 us faster (indexer logits
# 7.25 -> 7.11 us as launched), BF16 8 and 14 rows of 64K on 8 CTAs 2-5 %. A one-tile slice (8 items a thread) was
# 0.13-0.17 us slower that way (c16 1 x 64K 5.76 -> 5.93), so it keeps the predicated split; and the 16-CTA cubins,
# whose benchmark rows never take the path (one tile, or more than two), measured 1.3-2 % slower with it compiled in,
# so only clusters of up to SPARSE_SPLIT_MAX_CLUSTER have it.
SPARSE_SPLIT = True
SPARSE_SPLIT_MAX_CLUSTER = 8
# On clusters of at least ASYNC_PUSH_MIN_CLUSTER CTAs the gathered finish's pushes into CTA 0's list go by st.async,
# each word completing on CTA 0's push mbarrier (the "bar" array); every CTA then arrives on it once, relaxed, with
# its count of pushed bytes, and the cluster barrier after the pushes is relaxed as well. A release there
# (barrier.cluster.arrive's default) is a MEMBAR.ALL.GPU in SASS that waits for the CTA's outstanding DSMEM and
# global stores: ncu's hottest instruction on 8 x 64K (decode_topk_ncu_indexer_s20.json). The refined floor's path
# keeps the release: CTA 0 reads the peers' reservations (misc[15]) after it. Measured on the H200
# (decode_topk_ab_h200.json: async_pushes_s21_ab): FP32 on 16 CTAs 0.2-0.38 us faster, on 8 CTAs 0.2-0.3 us at
# 64K and at 256K-1M k512 but 0.1-0.3 us slower at 256K-1M k2048 (more pushes), BF16 within 0.1 us; on 2 CTAs (64 x
# 64K-256K, the refined floor's path) up to 0.45 us slower, so smaller clusters keep plain DSMEM stores and the
# release.
ASYNC_PUSH_MIN_CLUSTER = 8
# BF16 keys two columns a word in whole_group_keys (step 1's CTA tiles, the gather's re-reads). Measured on the H200
# (decode_topk_ab_h200.json: packed_bf16_keys_ab, with the table index by an unsigned shift): BF16 rows of 256K-1M on
# 8 and 16 CTAs 2.4-8.5 % faster (8 x 1M k512 23.47 -> 21.51 us, 1 x 1M k2048 16.21 -> 15.05), FP32 within noise.
PACKED_BF16_KEYS = True
# Token mode: step 1's CTA tiles on a slice of more than two tiles (no keys kept for the gather) histogram each column
# by its raw bits' top 11 (a shift and a mask, no key), into bins in raw order that one permutation turns into key
# order after the loop; a group holding NaN or +-0 takes the keys. The table entry comes from the group's largest
# value (max.bf16x2 / max.f32: raw_to_table_key).
# Measured on the H200 (decode_topk_ab_h200.json: raw_bins_ab, decode_topk's GPU tests and sanitizers on each
# candidate): BF16 rows of 256K-1M on 8 and 16 CTAs 2-7 % faster (8 x 1M k2048 23.58 -> 22.57 us, 1 x 1M k512
# 13.53 -> 12.56), FP32 0-2 % faster, short slices (two tiles or fewer: the key loop, unchanged) within 1 %. One loop
# for both with a branch a tile was 1-2 % slower on short slices; three tiles ahead, or three an iteration with no
# register moves, slower.
RAW_BINS_STEP1 = True
# Such a BF16 slice's tiles are requested into L2 STEP1_PREFETCH_AHEAD tiles ahead of the two whose loads are in
# registers (one bulk prefetch a tile), not the whole slice at once (which past some 24 MiB of logits a launch
# overflowed L2).
# Measured on the H200 (decode_topk_ab_h200.json: running_prefetch_ab, one process, rotated inputs): FP32 64 x 256K on
# the 2-CTA twin k2048 35.84 -> 30.70 us (with refined_floor), 8 x 1M on 8 CTAs 4-9 % faster, BF16 64 x 256K 14.5-22.5 %
# and 8 x 1M 8-10 %, 1 x 1M on 16 CTAs 2-5 %; the rest within 2 %. Two to four tiles ahead within 1 %.
STEP1_PREFETCH_AHEAD = 2
# An FP32 slice's tiles instead come into shared memory by bulk copies (thread 0 issues a tile's, completing on that
# stage's mbarrier), STEP1_BULK_BYTES of stages in flight in the room of the candidate list (unused by CTA tiles until
# step 1 ends), and each thread reads its group from there: no load pipeline in registers and no L2 prefetch.
# Measured on the H200 (decode_topk_ab_h200.json: bulk_step1_ab, one process, rotated inputs): FP32 64 x 256K on the
# 2-CTA twin k512 27.9 -> 25.9-26.3 us, k2048 30.4 -> 28.6-29.0 (6-8 %), 64 x 64K 4-5 %, 8 and 14 x 1M on 8 CTAs 3-6 %,
# but 8 x 256K on 8 CTAs 1-3 % and 1 x 1M on 16 CTAs 1.4-2.7 % slower; 64 KiB of stages about the same, 48 KiB loses
# most of the gain on the largest launches, an L2 prefetch past the stages slower. BF16 (8 KiB tiles) 3-12 % slower
# on 256K-1M rows: it keeps the register loads.
STEP1_BULK_DTYPES = ("f32",)
STEP1_BULK_BYTES = 80 * 1024
# On bulk-copied slices of clusters up to EARLY_PREFETCH_MAX_CLUSTER CTAs, thread 0 asks L2 for the slice's first
# EARLY_PREFETCH_TILES tiles of a row that ends at the launch's width before it reads the row's end (that read's
# latency then overlaps the first tiles'), where that slice has at least EARLY_PREFETCH_MIN_TILES tiles; a shorter
# row's end moves the slice, and the prefetch (inside the logits anyway) is wasted. Measured on the H200
# (decode_topk_ab_h200.json: early_prefetch_s20_ab): one tile, FP32 64 x 256K on the 2-CTA twin 1.3-2.1 % faster,
# 64 x 64K 0.6-1.2 %, 8 x 256K-1M on 8 CTAs 0.9-2.4 %; two tiles another 0.3 % at 64 x 256K k2048; five tiles 3-10 %
# slower (they compete with the bulk copies). On 8 and 16 CTAs the added code alone measured 1-3 % slower at 8 x 64K
# (slices of 2 tiles, no prefetch), so those keep none.
EARLY_PREFETCH_MAX_CLUSTER = 4
EARLY_PREFETCH_MIN_TILES = 8
EARLY_PREFETCH_TILES = 2
# The one-CTA-an-SM twins of up to EVICT_FIRST_MAX_CLUSTER CTAs read their bulk tiles with an L2 evict-first policy: the
# stream, read once, then leaves the rest of L2 (the code the tail runs once, the marked groups' lines) in place.
# Measured on the H200 (decode_topk_ab_h200.json: l2_policy_s19_ab, l2_evict_first_s20_ab): FP32 64 x 256K on the 2-CTA
# twin 1.1-1.6 % faster, 64 x 64K 1.4-1.9 %; on the two-CTA-an-SM builds 64 x 1M on 2 CTAs +3.7 %, 64 x 16K on 1 CTA
# +3 %.
EVICT_FIRST_MAX_CLUSTER = 4
GATHER_STAGE_MIN_CLUSTER = 16
# Step 1's table keeps the top TABLE_KEY_BITS bits of each group's largest key (a half-word): the first digit and 5
# bits more. REFINED_FLOOR: the gathered finish of CTA-tile slices (every CTA on a table or in registers) re-reads
# and gathers only the items from the threshold bin's sub-bin (its 32 by the next 5 bits) that at least krem groups'
# maxima reach, summed over the cluster (refined_floor), instead of the whole bin; on 2 to 8 CTAs, where the CTAs'
# share of the items from the bin up is at least REFINE_MIN_ITEMS_A_CTA and the bin at least REFINE_MIN_BIN_RATIO
# times what it must still give. Measured on the H200 (decode_topk_ab_h200.json: refined_floor_ab, rotated inputs):
# FP32 k2048 8 and 14 x 256K on 8 CTAs 11-13 % faster, 8 x 1M 5-8 %, 64 x 256K on the 2-CTA twin 36.4 -> 32.1 us
# alone; the table pass costs 2.5-2.9K cycles and the barrier 1-1.9K (timeline_refine), so small shares (k512 on
# 8 CTAs: 8-10 % slower) and 16 CTAs (1 x 256K k2048 4 % slower) keep the whole bin.
TABLE_KEY_BITS = 16
REFINED_FLOOR = True
# On bulk-copied slices (FP32) with refined_floor, step 1 also counts the groups' maxima (their table entries) in a
# window of REFINE_WINDOW_BINS first-digit bins by their next 5 bits, placed around the bin where the slice's first
# tile reaches its expected share of the row's k (refine_window_base). Where every CTA's window holds the threshold
# bin, refined_floor sums the peers' counts of it through distributed shared memory: no pass over the table, no
# cluster barrier. Else the table pass as before. Only where step 1 waits on memory, not on its own work, and the
# refined floor is likely: launches of at least REFINE_WINDOW_MIN_CTAS CTAs, slices of at least
# REFINE_WINDOW_MIN_TILES tiles, k of at least 256 a CTA (the window costs the tile loop a few instructions a tile and
# three CTA barriers), the loop compiled with and without it. Measured on the H200 (decode_topk_ab_h200.json:
# refine_window_ab): 64 x 256K FP32 on the 2-CTA twin 4.3-4.6 % faster (k2048 28.48 -> 27.18 us), the rest within
# -2.0..+1.4 %; on every launch it cost 5-7 % where the refined floor does not apply (k512 on 8 CTAs) and 4-6 % on
# half-wave launches, a test a tile 1-2.6 %.
REFINE_WINDOW_BINS = 8
REFINE_WINDOW_MIN_CTAS = 100
REFINE_WINDOW_MIN_TILES = 16
REFINE_MIN_ITEMS_A_CTA = 512
REFINE_MIN_BIN_RATIO = 4
REFINE_MAX_CLUSTER = 8
# The same staging for a CTA without a list (gather_slice, gather_marked: its in-bin items are pushed a
# few lanes at a time otherwise, two DSMEM stores an item, all CTAs into CTA 0 at once) on clusters of at
# least this many CTAs. Measured on the H200 (decode_topk_ab_h200.json: stage_no_list_ab; timelines: the
# gather pass of the slowest CTA took 6.7-8.9K cycles at k2048): 16 CTAs, 1 x 256K k2048 13.7 -> 11.6 us and
# 1 x 1M k2048 20.5 -> 18.0 us (FP32 and BF16); 8 CTAs, 8 and 14 rows of 256K-1M at k2048 1.1-1.6 us faster,
# k512 within -0.4..+0.15 us.
STAGE_NO_LIST_MIN_CLUSTER = 8
# On clusters of up to this many CTAs (the 2- and 4-CTA twins: up to 128K columns a CTA, many marked groups a
# warp), gather_marked issues a round's loads before the previous round's split, so a warp waits on L2 about
# once for all its rounds. Measured on the H200 (decode_topk_ab_h200.json: pipelined_marks_ab): 2-CTA twin
# 64 x 256K BF16 k2048 34.8 -> 32.4 us, 32 x 128K FP32 k2048 20.2 -> 19.3 us, 4-CTA twin 16 x 256K FP32 k2048
# 21.9 -> 21.4 us; on 8 and 16 CTAs (one or two rounds a warp) within -1.4..+1.7 % (16 CTAs mostly slower), and
# two rounds ahead no better on any, so they keep one round at a time.
PIPELINED_MARKS_MAX_CLUSTER = 4
# BF16 token mode on clusters of at least STAGE_NO_LIST_MIN_CLUSTER CTAs, where every CTA ran step 1 by tiles and
# stages its items of the threshold bin (the largest per-CTA count of the bin fits GATHER_STAGE): the key's last
# 5 bits are resolved cluster-wide from the stages (a 32-bin histogram each, summed through distributed shared
# memory), each CTA writes its own selected items at slots from a prefix over ranks, and exact ties of the resolved
# key are cut by rank (lower ranks hold lower columns); only the CTA the cut falls in ranks its own ties. No pushes
# to CTA 0 and no finish there (finish_low_bits). Measured on the H200 (decode_topk_ab_h200.json: low_bits_finish_ab):
# 16 CTAs 3.6-13.8 % faster (1 x 256K k2048 11.49 -> 9.90 us), 8 CTAs at k2048 1.8-12.9 % faster (8 x 256K 14.64 ->
# 12.75), 8 CTAs at k512 0.2-1.4 % slower (the extra cluster barrier), left ungated.
LOW_BITS_FINISH = True
# Step 1's warp loop in token mode on clusters of these sizes shares one bound among the CTA's
# warps, which a warp recomputes every BOUND_SHARE_PERIOD of its iterations (staggered: one
# warp in that many each iteration). Measured on the H200 (decode_topk_ab_h200.json:
# shared_bound_ab): 0.4-2.6 us faster on most 1- and 16-CTA rows (1 x 1M k2048 30.8 -> 29.1 us,
# 256 x 64K on 1 CTA 45.4 -> 42.8 us), slower on 8 CTAs (up to +1.2 us), no faster on 2 and 4,
# and 1.4-1.5 us slower in block mode on 16 CTAs (decode_topk_h200_s7.json), so off there.
BOUND_SHARE_CLUSTERS = (1, 16)
BOUND_SHARE_PERIOD = 16
# A short slice (CTA tiles, no list) computes its own floor and highest nonempty bin for the first
# digit's select (a CTA barrier and scan) on clusters of at least this many CTAs; on smaller ones the
# select reads all of its peer's bins instead. Measured on the H200 (decode_topk_ab_h200.json:
# short_floors_ab): on 2 CTAs 0.3-0.5 us faster without (64 x 8K 7.50 -> 7.10 us), on 4 CTAs
# 0.1-0.6 us slower, on 8 and 16 CTAs 1-5 us slower.
SHORT_FLOORS_MIN_CLUSTER = 4
# On those clusters the first digit's select first sums only the cluster's top SELECT_WINDOW_BINS bins (below the
# highest nonempty one) and takes the full window from the floors only where they hold fewer than k items; a short
# slice then sends its highest nonempty bin alone (local_top_bin: one reduction) instead of its k-th largest bin
# (local_kth_bin: a CTA-wide scan on the critical path, ~850 cycles on 8 x 64K: decode_topk_timeline_s29_h200.json).
# Measured on the H200 (decode_topk_ab_h200.json: select_window_s29_ab, select_window_s30): 4- to 16-CTA rows
# 0.1-0.3 us faster, the 70 benchmark cells' geomean x0.994 as launched, x0.995 in stream order. That first pass is
# one warp's (4 bins a lane, a warp scan; select_bins' one_warp) rather than the CTA's block scan and its barrier:
# select_warp_s30_ab, the 70 cells x0.981 both ways, FP32 4- and 8-CTA rows of 16K-64K 4-5 % faster (8 x 64K on
# DeepGEMM logits 7.17 -> 6.92 us as launched; the indexer step's selection 7.95 -> 7.55 us in stream order).
SELECT_WINDOW_BINS = 64
assert SELECT_WINDOW_BINS + 3 <= 4 * 32  # (that window's select by one warp, 4 bins a lane: select_bins)
# The gathered finish ranks up to this many exact ties of the resolved key directly (each against all of them)
# instead of running the index rounds; more ties (e.g. all-equal rows) take the rounds. Measured on the H200
# (decode_topk_ab_h200.json: tie_rank_ab): with 64, BF16 rows of 16K-256K 1.4-7.8 % faster (64 x 16K on 2 CTAs
# 8.67 -> 7.99 us), the rest within 0.7 %; with 256, BF16 k2048 rows of 256K-1M 1.5-4 % slower (a few hundred
# ties ranked against each other cost more than two rounds).
TIE_RANK_MAX = 64


def count_bits(most: int) -> int:
    """Bits of a count that is at most `most` (a compile-time value)."""
    return int(most).bit_length()


def pairwise_sum(terms: list):
    """The sum of a trace-time list of values as a balanced tree (a short dependency chain)."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return pairwise_sum(terms[:half]) + pairwise_sum(terms[half:])


def smem_addr(ptr: cute.Pointer) -> Int32:
    """The 32-bit shared::cta address of a shared-memory pointer (for the PTX helpers)."""
    return ptr.toint()


def sel(cond, a, b):
    """cond ? a : b, typed like a (cutlass.select_ returns a bare IR value)."""
    return type(a)(cutlass.select_(cond, a, b))


class DecodeTopK:
    """One variant: dtype, mode and cluster size are compile-time; k, shapes and strides are not."""

    def __init__(self, dtype: str, block_mode: bool, cluster: int, threads: int, hist_bins: int, list_capacity: int,
                 smem_bytes: int, warp_min_groups: int, ctas_per_sm: int, table_tiles: int = 0):
        assert dtype in ("f32", "bf16") and threads % WARP == 0 and hist_bins == 4 * threads
        assert threads // WARP <= 16  # the scan scratch holds 16 warp totals per buffer
        self.dtype = dtype
        self.block_mode = block_mode
        self.cluster = cluster
        self.threads = threads
        self.warps = threads // WARP
        self.bins = hist_bins
        self.cap = list_capacity
        self.smem_bytes = smem_bytes
        self.ctas_per_sm = ctas_per_sm
        # Step 1's bulk copies read the stream with an L2 evict-first policy (EVICT_FIRST_MAX_CLUSTER).
        self.stream_evict_first = ctas_per_sm == 1 and cluster <= EVICT_FIRST_MAX_CLUSTER
        # The gathered finish's pushes go by st.async onto CTA 0's push mbarrier (ASYNC_PUSH_MIN_CLUSTER).
        self.async_pushes = cluster >= ASYNC_PUSH_MIN_CLUSTER
        self.low_bits_finish = (LOW_BITS_FINISH and dtype == "bf16" and not block_mode and table_tiles > 0
                                and cluster >= STAGE_NO_LIST_MIN_CLUSTER)
        self.key_bits = 32 if dtype == "f32" else 16
        self.raw_bins = RAW_BINS_STEP1 and not block_mode
        self.elem_bytes = 4 if dtype == "f32" else 2
        # Digits from the top: 11 bits first (sign, exponent, 2 mantissa bits) so the
        # first bin already isolates a narrow value range; the rest as they fall.
        # Later digits are narrow: the cluster exchanges only 2**bits bins for them.
        self.digits = (11, 8, 8, 5) if dtype == "f32" else (11, 5)
        assert sum(self.digits) == self.key_bits
        # Items per 8-column group: 8 in token mode, 1 block in block mode.
        self.items = 1 if block_mode else 8
        # The gathered finish resolves the threshold bin's remaining key bits, then
        # (for exact ties) the index bits, largest first: (word, shift, bits) rounds.
        # Indices are < 2**21 (the host op's width limit): "lower index" is "larger ~index".
        low_key_digits = (("key", 10, 11), ("key", 0, 10)) if dtype == "f32" else (("key", 0, 5),)
        self.gather_rounds = low_key_digits + (("idx", 10, 11), ("idx", 0, 10))
        # Step 1 by independent warps (each its own contiguous sub-slice and list segment,
        # no CTA barrier per iteration) instead of CTA-wide tiles with an ordered scan
        # each, for slices of at least this many groups (chosen at run time, per CTA).
        self.warp_min_groups = warp_min_groups
        # With table_tiles, step 1's CTA tiles record, per 8-column group, the first digit of its largest key
        # (a half-word each, in an array of table_words words); the gather of a slice of more tiles than
        # kept in registers then re-reads only the groups holding an item at or above the row's threshold bin.
        self.table_tiles = table_tiles
        self.table_words = table_tiles * threads // 2
        # The gathered finish of CTA-tile slices takes the bin's items from a floor refined by the table
        # (refined_floor; clusters only: one CTA's own table gives no cluster-wide bound).
        self.refine_floor = REFINED_FLOOR and table_tiles > 0 and 1 < cluster <= REFINE_MAX_CLUSTER
        # Timing experiment (never in a committed cache): thread 0's SM clock at each phase's end
        # (DecodeTopK.mark), written over the row's logits at the end (gpu/jobs/topk_timeline.py).
        # (DECODE_TOPK_EXPERIMENT: a comma-separated set of the switches below.)
        experiment = set(os.environ.get("DECODE_TOPK_EXPERIMENT", "").split(","))
        self.timeline = bool(experiment & {"timeline", "timeline_step1", "timeline_gather", "timeline_refine",
                                           "timeline_finish"})
        # timeline_step1: marks 13 and 14 split step 1's first CTA tile (its loads landed, its histogram
        # atomics issued) instead of CTA 0's finish rounds.
        self.step1_marks = "timeline_step1" in experiment
        # timeline_gather: marks 13, 14 and 15 split the marked gather (gather_marked: its table read, its
        # compaction, its rounds; then a refined CTA's staged copy) instead of CTA 0's finish rounds.
        self.gather_marks = "timeline_gather" in experiment
        # timeline_refine: marks 13 and 14 split refined_floor (its table pass, its barrier and sums).
        self.refine_marks = "timeline_refine" in experiment
        # timeline_finish: marks 13, 14 and 15 split the gathered finish's first round (its histogram pass after a CTA
        # barrier, its select, then its tie ranking or round end) instead of the finish's rounds.
        self.finish_marks = "timeline_finish" in experiment
        # clustered_finish: the cluster-wide finish (finish_clustered) wherever the gathered one would run.
        self.force_clustered = "clustered_finish" in experiment
        # stop_at_<i> (timing only, wrong results): every CTA exits at timeline mark i, after a cluster barrier, so
        # that a phase's cost in the benchmark's conditions is the difference of two such builds' times
        # (decode_topk_ab_h200.json: phase_stops_s19). Marks 13-15: the gather's in timeline_gather builds, else CTA 0's
        # finish rounds (finish_stops_s19).
        stops = [int(e[len("stop_at_"):]) for e in experiment if e.startswith("stop_at_")]
        self.stop_at = stops[0] if stops else None
        if self.timeline:
            self.cap -= self.warps * LIST_VEC  # room for the 16 marks in the same shared memory
        # Step 1's bulk-copy stages (raw-bin tiles), then a full and an empty mbarrier each, in the list's room: the
        # key and idx arrays, allocated back to back (each a multiple of 16 bytes).
        self.tile_bytes = threads * 8 * self.elem_bytes
        # (None in the row kernel: no list, and no step 1 by tiles.)
        with_bulk = dtype in STEP1_BULK_DTYPES and self.raw_bins and list_capacity > 0
        self.bulk_stages = STEP1_BULK_BYTES // self.tile_bytes if with_bulk else 0
        # refine_window: step 1's counts of the groups' maxima around the threshold bin (REFINE_WINDOW_BINS).
        self.refine_window = self.refine_floor and self.bulk_stages > 0
        assert REFINE_MAX_CLUSTER <= 8  # (the window bases: s_peer[24, 32))
        assert self.bulk_stages == 0 or (self.bulk_stages * (self.tile_bytes + 16) <= 2 * self.cap * 4
                                         and self.cap * 4 % 16 == 0)
        assert PREFETCH_PIECE_BYTES // (8 * self.elem_bytes) * threads >= warp_min_groups  # one piece a thread
        assert list_capacity % (self.warps * LIST_VEC) == 0
        assert 2 * GATHER_STAGE <= hist_bins  # the pushes' stage is the second histogram buffer
        # gather_marked's tile mask is one word, its group offsets half-words; the table covers every tile and
        # serves slices of more than the two tiles kept in registers (one CTA an SM).
        assert table_tiles <= 32 and (table_tiles == 0 or warp_min_groups - 1 <= table_tiles * threads)
        assert self.key_bits >= TABLE_KEY_BITS == 16 and self.digits[0] + 5 == TABLE_KEY_BITS  # refined_floor's 32
        assert table_tiles == 0 or ctas_per_sm == 1

    def smem_arrays(self):
        """The kernel's shared-memory arrays in allocation order, (name, 32-bit words) each, every one
        16-byte aligned: what the contract's SMEM_BYTES has to hold (tests/test_topk_reference.py)."""
        arrays = [("hist", 2 * self.bins),  # two histograms (the finish alternates)
                  ("scan", 2 * 32),  # two scan scratch buffers
                  ("misc", 16),
                  ("warp", 32),
                  # Written by the peers: [r] CTA r's k-th largest bin after step 1, [16] CTA 0's list
                  # length, [24 + r] CTA r's refine window (refine_window_base), [32 + r] CTA r's highest nonempty
                  # bin. This CTA's own (low_bits_finish): [17] the largest CTA count of the first digit's bin,
                  # [18, 24) finish_low_bits' sums.
                  ("peer", 48),
                  ("key", self.cap),
                  ("idx", self.cap)]
        if self.table_tiles:
            arrays.append(("table", self.table_words))
            # refine_window's counts (every variant with a table has the room: the contract's STEP1_TABLE_BYTES).
            arrays.append(("window", REFINE_WINDOW_BINS * 32))
        # Two mbarriers, last: CTA 0's push mbarrier (ASYNC_PUSH_MIN_CLUSTER) and the peers' words' (peer_words_bar).
        # Last, so the arrays before them keep their alignment (the list's bulk stages lost 0.6-1.4 us to a 16-byte
        # shift, async_pushes_s21_ab).
        arrays.append(("bar", 4))
        if self.timeline:
            arrays.append(("marks", 16))
        return arrays

    def smem_offsets(self) -> dict:
        """Byte offset of each of smem_arrays' arrays from the first, as allocate_smem places them (16-byte aligned,
        in order)."""
        offsets = {}
        used = 0
        for name, words in self.smem_arrays():
            used = (used + 15) // 16 * 16
            offsets[name] = used
            used += 4 * words
        return offsets

    def peer_word_bytes(self) -> int:
        """The bytes of the words every CTA of a cluster receives from its peers before the first digit's select:
        each CTA's floor and highest nonempty bin (and refine window), and CTA 0's list length."""
        words = 2 * self.cluster + 1 + (self.cluster if self.refine_window else 0)
        return 4 * words

    def bar_address(self, s_misc: cute.Pointer, slot: int) -> Int32:
        """The shared address of this CTA's mbarrier `slot` of the "bar" array (0: CTA 0's pushes, 1: the peers'
        words), found from s_misc (the sites that need one have it at hand)."""
        offsets = self.smem_offsets()
        return smem_addr(s_misc) + (offsets["bar"] + 8 * slot - offsets["misc"])

    def peer_words_bar(self, s_misc: cute.Pointer) -> Int32:
        """The shared address of this CTA's mbarrier for its peers' words."""
        return self.bar_address(s_misc, 1)

    @cute.jit
    def push_peer_word(self, word: cute.Pointer, value, peer: Int32, peer_bar: Int32):
        """value into word of CTA peer's s_peer, completing 4 bytes on its peer_words_bar (at peer_bar)."""
        ptx.st_async_b32(ptx.mapa_shared(smem_addr(word), peer), Uint32(value), peer_bar)

    def push_bar(self, s_misc: cute.Pointer):
        """The shared::cluster address of CTA 0's push mbarrier; None where the pushes are plain DSMEM stores (traced
        inline)."""
        if not self.async_pushes:
            return None
        return ptx.mapa_shared(self.bar_address(s_misc, 0), Int32(0))

    def allocate_smem(self) -> dict:
        """smem_arrays' arrays in the kernel's dynamic shared memory, by name (traced inside a kernel)."""
        smem = SmemAllocator()
        return {name: smem.allocate_array(Uint32 if name == "key" else Int32, words, byte_alignment=16)
                for name, words in self.smem_arrays()}

    # ------------------------------------------------------------------ launch
    @cute.jit
    def __call__(self, logits: cute.Pointer, row_ends: cute.Pointer, out: cute.Pointer, width: Int32, stride: Int32,
                 out_stride: Int32, k: Int32, stream):
        self.kernel(logits, row_ends, out, width, stride, out_stride, k).launch(
            grid=[self.cluster, 1, 1],
            block=[self.threads, 1, 1],
            cluster=[self.cluster, 1, 1],
            smem=self.smem_bytes,
            stream=stream,
            # Two CTAs an SM (the shared memory is sized for it) cap registers at 64; one allows 128.
            min_blocks_per_mp=self.ctas_per_sm,
            preferred_smem_carveout=100,
        )

    # ------------------------------------------------------------------ keys
    @cute.jit
    def key_of(self, raw: Uint32) -> Uint32:
        """Order-preserving key of raw float bits: larger value -> larger key, NaN -> -inf, -0 -> +0."""
        if const_expr(self.dtype == "f32"):
            mag = raw & Uint32(0x7FFFFFFF)
            neg = (raw >> Uint32(31)) != Uint32(0)
            key = sel(neg, ~raw, raw | Uint32(0x80000000))
            key = sel(mag > Uint32(0x7F800000), Uint32(0x007FFFFF), key)
            key = sel(mag == Uint32(0), Uint32(0x80000000), key)
            return Uint32(key)
        else:
            mag = raw & Uint32(0x7FFF)
            neg = (raw & Uint32(0x8000)) != Uint32(0)
            key = sel(neg, raw ^ Uint32(0xFFFF), raw | Uint32(0x8000))
            key = sel(mag > Uint32(0x7F80), Uint32(0x007F), key)
            key = sel(mag == Uint32(0), Uint32(0x8000), key)
            return Uint32(key)

    @cute.jit
    def load_raw(self, row_addr: Int64, g: Int32, g_end: Int32, row_end: Int32, rraw: cute.Tensor):
        """Issue the loads of group g's raw bits into rraw (nothing if g >= g_end); no use of them here.

        FP32: rraw[j] is column j; BF16: rraw[j // 2] holds columns j (low half) and j + 1.
        Full groups take 16-byte loads; the row's last, partial group loads column by
        column so nothing at or past row_end is read. Keeping the values untouched
        until raw_to_items lets a caller overlap these loads with other work.
        """
        if g < g_end:
            col0 = g * 8
            addr = row_addr + Int64(col0) * self.elem_bytes
            if col0 + 8 <= row_end:
                if const_expr(self.dtype == "f32"):
                    rraw[0], rraw[1], rraw[2], rraw[3] = ptx.ld_global_nc_v4_u32(addr)
                    rraw[4], rraw[5], rraw[6], rraw[7] = ptx.ld_global_nc_v4_u32(addr + 16)
                else:
                    rraw[0], rraw[1], rraw[2], rraw[3] = ptx.ld_global_nc_v4_u32(addr)
            else:
                for j in cutlass.range_constexpr(8):
                    if col0 + j < row_end:
                        if const_expr(self.dtype == "f32"):
                            rraw[j] = ptx.ld_global_nc_u32(addr + j * 4)
                        else:
                            half = ptx.ld_global_nc_u16(addr + j * 2)
                            if const_expr(j % 2 == 0):
                                rraw[j // 2] = half
                            else:
                                rraw[j // 2] = rraw[j // 2] | (half << Uint32(16))

    @cute.jit
    def prefetch_groups(self, row_addr: Int64, g0: Int32, g1: Int32, row_end: Int32):
        """Bulk-prefetch the row's groups [g0, g1) into L2, clipped to row_end (rounded up to 16
        bytes: still inside the row, whose stride is a multiple of 16 bytes). Nothing if empty."""
        end = g1 * 8
        end = sel(end < row_end, end, row_end)
        lo = g0 * 8 * self.elem_bytes
        hi = (end * self.elem_bytes + 15) // 16 * 16
        if hi > lo:
            ptx.prefetch_l2_bulk(row_addr + Int64(lo), hi - lo)

    @cute.jit
    def prefetch_tile(self, row_addr: Int64, g0: Int32, g_hi: Int32, row_end: Int32):
        """prefetch_groups of the CTA tile from group g0 on, clipped to the slice (nothing past it)."""
        if g0 < g_hi:
            self.prefetch_groups(row_addr, g0, Int32(sel(g0 + self.threads < g_hi, g0 + self.threads, g_hi)), row_end)

    @cute.jit
    def prime_loads(self, row_addr: Int64, g: Int32, step: int, g_end: Int32, row_end: Int32, rnext: cute.Tensor,
                    rnext2: cute.Tensor):
        """Start step 1's load pipeline: groups g and g + step in flight (two iterations ahead)."""
        self.load_raw(row_addr, g, g_end, row_end, rnext)
        self.load_raw(row_addr, g + step, g_end, row_end, rnext2)

    @cute.jit
    def next_loads(self, row_addr: Int64, g_ahead: Int32, g_end: Int32, row_end: Int32, rraw: cute.Tensor,
                   rnext: cute.Tensor, rnext2: cute.Tensor):
        """Advance the pipeline: this iteration's raw bits into rraw, group g_ahead's loads issued."""
        self.rotate_loads(rraw, rnext, rnext2)
        self.load_raw(row_addr, g_ahead, g_end, row_end, rnext2)

    @cute.jit
    def rotate_loads(self, rraw: cute.Tensor, rnext: cute.Tensor, rnext2: cute.Tensor):
        """The load pipeline's registers move one stage: rraw <- rnext <- rnext2 (free for the next loads)."""
        for j in cutlass.range_constexpr(8):
            rraw[j] = rnext[j]
            rnext[j] = rnext2[j]

    @cute.jit
    def raw_to_items(self, rraw: cute.Tensor, g: Int32, g_end: Int32, row_end: Int32, rkeys: cute.Tensor):
        """Group g's items from its raw bits: 8 column keys, or 1 block key (their max).

        Columns at or past row_end, and every column of a group g >= g_end, get key 0:
        below every real key (-inf's key is 0x7FFFFF / 0x7F), so never selected on the
        rows that run a selection (more than k candidates).
        """
        n_valid = row_end - g * 8
        n_valid = sel(n_valid > 8, Int32(8), n_valid)
        n_valid = Int32(sel(g < g_end, n_valid, Int32(0)))
        if n_valid == 8:  # a whole group (every group but a row's last)
            self.whole_group_keys(rraw, rkeys)
        elif n_valid == 0:  # no group (a lane past the slice): no key_of for columns that are all dropped
            for j in cutlass.range_constexpr(8):
                rkeys[j] = Uint32(0)
        else:
            for j in cutlass.range_constexpr(8):
                rkeys[j] = sel(n_valid > j, self.key_of(self.raw_column(rraw, j)), Uint32(0))
        if const_expr(self.block_mode):
            m = rkeys[0]
            for j in cutlass.range_constexpr(1, 8):
                m = sel(rkeys[j] > m, rkeys[j], m)
            rkeys[0] = Uint32(m)

    @cute.jit
    def whole_group_keys(self, rraw: cute.Tensor, rkeys: cute.Tensor):
        """key_of of a whole group's 8 columns: each by the sign trick alone (ordinary_key), and one
        test for NaN and zero over the group (|x| - 1 wraps for a zero), where key_of takes the whole group.
        Measured on the H200 (decode_topk_ab_h200.json: ordinary_key_ab): 0.3-3 us off long rows' step 1."""
        if const_expr(self.dtype == "bf16" and PACKED_BF16_KEYS):
            # Two columns a word: both halves' keys at once (no carry crosses the halves), and one test for NaN
            # (|x| + 0x7F sets bit 15) and zero (|x| + 0x7FFF leaves it clear) in either half.
            special = Uint32(0)
            for p in cutlass.range_constexpr(4):
                r = rraw[p]
                mag = r & Uint32(0x7FFF7FFF)
                special = special | (mag + Uint32(0x007F007F)) | ~(mag + Uint32(0x7FFF7FFF))
                kp = r ^ ((((r >> Uint32(15)) & Uint32(0x00010001)) * Uint32(0x7FFF)) | Uint32(0x80008000))
                rkeys[2 * p] = kp & Uint32(0xFFFF)
                rkeys[2 * p + 1] = kp >> Uint32(16)
            if special & Uint32(0x80008000) != Uint32(0):
                for j in cutlass.range_constexpr(8):
                    rkeys[j] = self.key_of(self.raw_column(rraw, j))
        else:
            probe = Uint32(0)
            for j in cutlass.range_constexpr(8):
                raw = self.raw_column(rraw, j)
                rkeys[j] = self.ordinary_key(raw)
                below = (raw & Uint32((1 << (self.key_bits - 1)) - 1)) - Uint32(1)
                probe = sel(below > probe, below, probe)
            if probe >= Uint32(0x7F800000 if self.dtype == "f32" else 0x7F80):
                for j in cutlass.range_constexpr(8):
                    rkeys[j] = self.key_of(self.raw_column(rraw, j))

    def ordinary_key(self, raw: Uint32) -> Uint32:
        """key_of for a value that is neither NaN nor zero (+-0): flip every bit of a negative one, the sign bit of
        a positive one (traced inline; whole_group_keys tests a group for the other cases)."""
        if const_expr(self.dtype == "f32"):
            return raw ^ (Uint32(Int32(raw) >> Int32(31)) | Uint32(0x80000000))
        return raw ^ (((raw >> Uint32(15)) * Uint32(0x7FFF)) | Uint32(0x8000))

    def raw_column(self, rraw: cute.Tensor, j: int) -> Uint32:
        """Column j (0..7) of a group's raw bits (load_raw's layout) as the low bits of a word (traced inline)."""
        if const_expr(self.dtype == "f32"):
            return rraw[j]
        return (rraw[j // 2] >> Uint32(16 * (j % 2))) & Uint32(0xFFFF)

    @cute.jit
    def group_items(self, g: Int32, g_end: Int32, row_end: Int32) -> Int32:
        """How many of group g's items exist: its columns before row_end (token mode) or its block; 0 past g_end."""
        n = Int32(1)
        if const_expr(not self.block_mode):
            n = row_end - g * 8
            n = Int32(sel(n > 8, Int32(8), n))
        return Int32(sel(g < g_end, n, Int32(0)))

    @cute.jit
    def filter_values(self, rraw: cute.Tensor, g: Int32, g_end: Int32, row_end: Int32, rvals: cute.Tensor):
        """Group g's item values for the step-1 filter.

        Token mode: each column's value as FP32 bits (BF16 widened by a shift), compared
        with the threshold as floats: one instruction, no key. key_of runs only on the
        few items that pass (listed_key). Block mode: the exact key of the block (the
        maximum of its columns).
        """
        if const_expr(self.block_mode):
            self.raw_to_items(rraw, g, g_end, row_end, rvals)
        elif const_expr(self.dtype == "bf16"):
            for j in cutlass.range_constexpr(8):
                rvals[j] = (rraw[j // 2] << Uint32(16 * (1 - j % 2))) & Uint32(0xFFFF0000)
        # FP32 token mode compares rraw itself (the warp loop's lane-contiguous tiles).

    @cute.jit
    def listed_key(self, v: Uint32) -> Uint32:
        """The exact key of a value filter_values produced."""
        if const_expr(self.block_mode):
            return v
        elif const_expr(self.dtype == "f32"):
            return self.key_of(v)
        else:
            return self.key_of(v >> Uint32(16))

    @cute.jit
    def pass_threshold(self, bound: Uint32) -> Uint32:
        """What an item's value is compared with in step 1: every item whose exact key's first digit
        is >= bound passes (and a few more: -0 beside +0, NaN).

        Token mode: the FP32 bits of the smallest value in bin `bound` (the inverse of key_of on
        the bin's first key); below bin 4 (-inf and NaN are in bin 3) -inf, and NaN passes any
        threshold (setp.geu): everything passes. Block mode: the bin's first key.
        """
        first = bound << Uint32(self.key_bits - self.digits[0])
        if const_expr(self.block_mode):
            return Uint32(first)
        else:
            sign = Uint32(1 << (self.key_bits - 1))
            raw = sel(first >= sign, first & (sign - Uint32(1)), ~first & (sign | (sign - Uint32(1))))
            raw = raw << Uint32(32 - self.key_bits)
            return Uint32(sel(bound >= Uint32(4), raw, Uint32(0xFF800000)))

    @cute.jit
    def item_passes(self, v: Uint32, thr: Uint32) -> Int32:
        """1 if a filter value passes the threshold (pass_threshold), else 0."""
        if const_expr(self.block_mode):
            return Int32(sel(v >= thr, Int32(1), Int32(0)))
        else:
            return ptx.f32_geu(v, thr)

    @cute.jit
    def passing_count(self, rvals: cute.Tensor, n_valid: Int32, thr: Uint32):
        """This lane's items passing the step-1 filter, the warp's passing items in lanes below, and the warp's
        total."""
        cnt = Int32(0)
        if n_valid >= self.items:
            # Written as a pairwise sum (three dependent adds instead of eight); ptxas may still
            # emit a chain of predicated increments (it does in the FP32 token cubins).
            cnt = Int32(pairwise_sum([self.item_passes(rvals[j], thr) for j in range(self.items)]))
        else:  # the row's partial last group, or a lane past its warp's part
            for j in cutlass.range_constexpr(self.items):
                cnt = cnt + sel(j < n_valid, self.item_passes(rvals[j], thr), Int32(0))
        excl, tot = self.warp_small_prefix(cnt, count_bits(self.items))
        return cnt, excl, tot

    @cute.jit
    def item_index(self, g: Int32, j: int) -> Int32:
        """The output index of item j of group g: its column (token mode) or the block g."""
        if const_expr(self.block_mode):
            return g
        else:
            return g * 8 + j

    @cute.jit
    def count_vs_threshold(self, rkeys: cute.Tensor, mask: Uint32, prefix: Uint32):
        """How many of a group's items are above the threshold (key & mask > prefix) and equal to it."""
        gt = Int32(0)
        eq = Int32(0)
        for j in cutlass.range_constexpr(self.items):
            gt = gt + sel(rkeys[j] & mask > prefix, Int32(1), Int32(0))
            eq = eq + sel(rkeys[j] & mask == prefix, Int32(1), Int32(0))
        return gt, eq

    @cute.jit
    def bin_bounds(self, b0):
        """The key range [lo, hi) of first-digit bin b0 (hi past every key for the top bin: no key is 0xFFFFFFFF)."""
        shift0 = Uint32(self.key_bits - self.digits[0])
        b = Int32(b0)
        lo = Uint32(b) << shift0
        hi = Uint32(sel(b + 1 < self.bins, Uint32(b + 1) << shift0, Uint32(0xFFFFFFFF)))
        return lo, hi

    def bin_ceiling(self, lo: Uint32) -> Uint32:
        """The end of the first-digit bin holding key lo (traced inline): what bin_bounds gives as hi."""
        return self.bin_bounds(lo >> Uint32(self.key_bits - self.digits[0]))[1]

    @cute.jit
    def count_in_bin(self, rkeys: cute.Tensor, lo: Uint32, hi: Uint32):
        """How many of a group's items are above the key range [lo, hi) and in it."""
        gt = Int32(0)
        eq = Int32(0)
        for j in cutlass.range_constexpr(self.items):
            gt = gt + sel(rkeys[j] >= hi, Int32(1), Int32(0))
            eq = eq + sel((rkeys[j] >= lo) & (rkeys[j] < hi), Int32(1), Int32(0))
        return gt, eq

    @cute.jit
    def split_group(self, rkeys: cute.Tensor, g: Int32, lo: Uint32, hi: Uint32, out_addr: Int64, list_addr: Int32,
                    idx_delta: Int32, to_cluster: bool = False, mbar=None):
        """Group g's items above [lo, hi) to out_addr on, those in it to the list at list_addr on (keys; indices
        idx_delta bytes further): one predicated sequence an item, no branch (ptx.split_by_bin). to_cluster: the
        list is CTA 0's (shared::cluster addresses); with mbar, by st.async completing on its push mbarrier."""
        for j in cutlass.range_constexpr(self.items):
            out_addr, list_addr = ptx.split_by_bin(out_addr, list_addr, idx_delta, rkeys[j], self.item_index(g, j), hi,
                                                   lo, to_cluster, mbar)
        return out_addr, list_addr

    @cute.jit
    def load_items(self, row_addr: Int64, g: Int32, g_end: Int32, row_end: Int32, rraw: cute.Tensor,
                   rkeys: cute.Tensor):
        """The items of group g (8 column keys, or 1 block key); all key 0 if g >= g_end."""
        self.load_raw(row_addr, g, g_end, row_end, rraw)
        self.raw_to_items(rraw, g, g_end, row_end, rkeys)

    # ------------------------------------------------------------------ block-wide helpers
    @cute.jit
    def block_scan(self, val: Int32, scratch: cute.Pointer, bits: int = 0):
        """Inclusive prefix sum of val over the CTA's threads, and the CTA total.

        With bits, val < 2**bits and the warp part is warp_small_prefix (ballots, not a
        shuffle chain). One barrier; the caller alternates between two scratch buffers
        (or puts a barrier between calls) so a later call cannot overwrite words still
        being read.
        """
        tid = cute.arch.thread_idx()[0]
        lane = tid % WARP
        warp = tid // WARP
        x = val
        if const_expr(bits > 0):
            excl, warp_total = self.warp_small_prefix(val, bits)
            x = excl + val
            if lane == WARP - 1:
                cute.arch.store(scratch + warp, warp_total)
        else:
            x = self.warp_incl_scan(val)
            if lane == WARP - 1:
                cute.arch.store(scratch + warp, x)
        cute.arch.sync_threads()
        t = Int32(0)
        if lane < self.warps:
            t = cute.arch.load(scratch + lane, Int32)
        before, total = self.combine_warp_totals([t], lane, warp)
        return before[0] + x, total[0]

    @cute.jit
    def block_scan2(self, a: Int32, b: Int32, scratch: cute.Pointer):
        """block_scan of two values at once (one barrier): (incl_a, total_a, incl_b, total_b)."""
        tid = cute.arch.thread_idx()[0]
        lane = tid % WARP
        warp = tid // WARP
        x = a
        y = b
        for s in cutlass.range_constexpr(5):
            xs = cute.arch.shuffle_sync_up(x, 1 << s)
            ys = cute.arch.shuffle_sync_up(y, 1 << s)
            x = sel(lane >= (1 << s), x + xs, x)
            y = sel(lane >= (1 << s), y + ys, y)
        x = Int32(x)
        y = Int32(y)
        if lane == WARP - 1:
            cute.arch.store(scratch + warp, x)
            cute.arch.store(scratch + 16 + warp, y)
        cute.arch.sync_threads()
        tx = Int32(0)
        ty = Int32(0)
        if lane < self.warps:
            tx = cute.arch.load(scratch + lane, Int32)
            ty = cute.arch.load(scratch + 16 + lane, Int32)
        before, total = self.combine_warp_totals([tx, ty], lane, warp)
        return before[0] + x, total[0], before[1] + y, total[1]

    def combine_warp_totals(self, totals, lane, warp):
        """Per value: (the sum of the warp totals before this warp, the CTA total), lane w holding warp w's total.

        Butterflies over the lanes (two chains a value, interleaved) rather than every lane loading every warp's
        total: fewer instructions on every warp (the routed long rows 0.6 % faster, issue_cuts_s22_ab candidate T).
        """
        before = [sel(lane < warp, t, Int32(0)) for t in totals]
        total = list(totals)
        for s in range(5):
            before = [b + cute.arch.shuffle_sync_bfly(b, 1 << s) for b in before]
            total = [t + cute.arch.shuffle_sync_bfly(t, 1 << s) for t in total]
        return before, total

    @cute.jit
    def warp_slots(self, count: Int32, counter: cute.Pointer):
        """Exclusive offset of this lane's `count` items within slots the warp reserves on a CTA counter.

        One shared-memory atomic per warp instead of one per item.
        """
        lane = cute.arch.lane_idx()
        x = self.warp_incl_scan(count)
        total = cute.arch.shuffle_sync(x, WARP - 1)
        base = Int32(0)
        if lane == WARP - 1:
            if total > 0:
                base = cute.arch.atomic_add(counter, total)
        base = cute.arch.shuffle_sync(base, WARP - 1)
        return base + x - count

    @cute.jit
    def warp_slots2(self, a: Int32, b: Int32, counter_a: cute.Pointer, counter_b: cute.Pointer):
        """warp_slots of two counts at once: one scan of both packed in a word (each warp total below 2**16)."""
        lane = cute.arch.lane_idx()
        packed = (a << 16) | b
        x = self.warp_incl_scan(packed)
        total = cute.arch.shuffle_sync(x, WARP - 1)
        base_a = Int32(0)
        base_b = Int32(0)
        if lane == WARP - 1:
            base_a = cute.arch.atomic_add(counter_a, total >> 16)
            base_b = cute.arch.atomic_add(counter_b, total & 0xFFFF)
        excl = x - packed
        return (cute.arch.shuffle_sync(base_a, WARP - 1) + (excl >> 16),
                cute.arch.shuffle_sync(base_b, WARP - 1) + (excl & 0xFFFF))

    @cute.jit
    def warp_slot1(self, flag, counter: cute.Pointer) -> Int32:
        """warp_slots for 0/1 counts: a ballot and a popcount instead of a scan."""
        ballot = cute.arch.vote_ballot_sync(flag)
        before = Int32(cute.arch.popc(ballot & cute.arch.lanemask_lt()))
        return self.warp_atomic_base(Int32(cute.arch.popc(ballot)), counter) + before

    @cute.jit
    def cluster_arrive_own_smem(self):
        """Arrive at the cluster barrier releasing only this CTA's shared memory, for the peers' reads of it after
        their wait: a CTA-level MEMBAR in SASS, where the default release is a MEMBAR.ALL.GPU on every warp (0.2-0.45
        us on the critical path of a clustered launch: decode_topk_ab_h200.json, select_barrier_s28_ab and
        select_release_s29_ab; gpu/micro/cluster_exchange.cu). Not for generic stores into a peer's shared memory:
        those need the full release, or st.async."""
        ptx.fence_release_shared_cta_cluster()
        cute.arch.cluster_arrive_relaxed()

    @cute.jit
    def cluster_select(self, hist: cute.Pointer, nbins: int, krem: Int32, scratch: cute.Pointer,
                       misc: cute.Pointer, floors=None, local: bool = False):
        """Sum the cluster's histograms and find the bin b holding the krem-th largest item.

        Returns (b, above, count, mine_above): above = number of items in bins above b,
        so the k-th item is the (krem - above)-th largest of the count items in bin b;
        mine_above = how many of the above are this CTA's (its slots among the > threshold).
        Thread t owns bins 4t..4t+3; only the first nbins (the digit's) are read. With
        floors (the first digit), every CTA has stored into floors[its rank] of each CTA a bin
        that the answer cannot be below (its own k-th largest bin); bins under the cluster's
        highest such floor are not read from the peers (they may be incomplete, too), nor those
        above every CTA's highest nonempty bin (floors[32 + r]).
        The cluster barrier orders every CTA's histogram atomics before the peers'
        reads (release/acquire; for the first digit a release of the CTA's own shared
        memory only, cluster_arrive_own_smem, the peers' words having come by st.async);
        it also serves as the CTA barrier. With local, only this CTA's histogram counts
        (the gathered finish of one CTA). With floors (the first digit), misc[4] gets bin b's
        count of the lower-ranked CTAs (their columns are lower: the gathered finish's place
        for this CTA's items of the bin), from the same reads.
        """
        tid = cute.arch.thread_idx()[0]
        clustered = self.cluster > 1 and not local
        with_floors = floors is not None
        if const_expr(clustered and with_floors):
            # The peers read this CTA's histogram, and CTA 0's counters and list room (zeroed, filled in step 1)
            # take their adds and pushes from here on: all of it this CTA's shared memory. The peers' words came
            # by st.async (no generic store into a peer): their mbarrier says they are in.
            self.cluster_arrive_own_smem()
            cute.arch.cluster_wait()
            ptx.mbarrier_wait_parity(self.peer_words_bar(misc), 0, cluster=False)
        elif const_expr(clustered):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        lo = Int32(0)
        hi = Int32(nbins - 1)
        if const_expr(with_floors and clustered):
            # The peers' floors and highest nonempty bins are local (stored here before the barrier):
            # every thread takes the maxima. No CTA has an item above the highest of the latter, so
            # the bins above it are not read (from 16 peers, reading every bin above the floor
            # moved some 30 KiB through distributed shared memory on randn rows).
            hi = Int32(0)
            for r in cutlass.range_constexpr(self.cluster):
                f = cute.arch.load(floors + r, Int32)
                lo = Int32(sel(f > lo, f, lo))
                t = cute.arch.load(floors + 32 + r, Int32)
                hi = Int32(sel(t > hi, t, hi))
        if const_expr(with_floors and clustered and self.cluster >= SHORT_FLOORS_MIN_CLUSTER):
            # First the top SELECT_WINDOW_BINS bins only (every CTA reads the same, so the same choice after): they
            # hold the krem-th largest item wherever they hold krem items; else the whole window from the floors.
            lo_top = Int32(sel(hi - (SELECT_WINDOW_BINS - 1) > lo, hi - (SELECT_WINDOW_BINS - 1), lo))
            total = self.select_bins(hist, nbins, krem, scratch, misc, floors, clustered, lo_top, hi, one_warp=True)
            if total < krem:
                self.select_bins(hist, nbins, krem, scratch, misc, floors, clustered, lo, hi)
        else:
            self.select_bins(hist, nbins, krem, scratch, misc, floors, clustered, lo, hi)
        return (cute.arch.load(misc + 0, Int32), cute.arch.load(misc + 1, Int32), cute.arch.load(misc + 6, Int32),
                cute.arch.load(misc + 7, Int32))

    @cute.jit
    def select_bins(self, hist: cute.Pointer, nbins: int, krem: Int32, scratch: cute.Pointer, misc: cute.Pointer,
                    floors, clustered: bool, lo: Int32, hi: Int32, one_warp: bool = False) -> Int32:
        """cluster_select's sums over bins [lo, hi] (the peers' too where clustered) and its select into misc (where
        they hold krem items); returns their total (the same on every CTA). Ends with a CTA barrier. Thread t sums
        bins 4t..4t+3; with one_warp (a window of at most 4 * WARP - 3 bins), lane l of warp 0 sums bins
        (lo & ~3) + 4l.. and a warp scan replaces the CTA's."""
        tid = cute.arch.thread_idx()[0]
        with_floors = floors is not None
        if const_expr(one_warp):
            bin0 = (lo & Int32(-4)) + cute.arch.lane_idx() * 4
            active = (tid < WARP) & (bin0 <= hi)
        else:
            bin0 = tid * 4
            active = (bin0 < nbins) & (bin0 + 3 >= lo) & (bin0 <= hi)
        # Only the digit's 2**bits bins take part (the rest of the buffer may be stale).
        c0 = Int32(0)
        c1 = Int32(0)
        c2 = Int32(0)
        c3 = Int32(0)
        l0 = Int32(0)
        l1 = Int32(0)
        l2 = Int32(0)
        l3 = Int32(0)
        e0 = Int32(0)  # the lower-ranked CTAs' counts (first digit of a cluster): misc[4] for bin b
        e1 = Int32(0)
        e2 = Int32(0)
        e3 = Int32(0)
        m0 = Int32(0)  # (low_bits_finish, first digit) the largest CTA count of each bin: floors[17] for bin b
        m1 = Int32(0)
        m2 = Int32(0)
        m3 = Int32(0)
        with_max = with_floors and clustered and self.low_bits_finish
        if active:
            l0 = cute.arch.load(hist + bin0, Int32)
            l1 = cute.arch.load(hist + bin0 + 1, Int32)
            l2 = cute.arch.load(hist + bin0 + 2, Int32)
            l3 = cute.arch.load(hist + bin0 + 3, Int32)
            if const_expr(clustered):
                mine = smem_addr(hist + bin0)
                rank = cute.arch.block_idx_in_cluster()
                # Eight peers at a time: all sixteen in flight would cost the step-1 loop its registers.
                for r in cutlass.range(self.cluster, unroll=8):
                    v0, v1, v2, v3 = ptx.ld_cluster_v4_u32(ptx.mapa_shared(mine, r))
                    c0 = c0 + Int32(v0)
                    c1 = c1 + Int32(v1)
                    c2 = c2 + Int32(v2)
                    c3 = c3 + Int32(v3)
                    if const_expr(with_floors):
                        below = r < rank
                        e0 = e0 + sel(below, Int32(v0), Int32(0))
                        e1 = e1 + sel(below, Int32(v1), Int32(0))
                        e2 = e2 + sel(below, Int32(v2), Int32(0))
                        e3 = e3 + sel(below, Int32(v3), Int32(0))
                    if const_expr(with_max):
                        m0 = Int32(sel(Int32(v0) > m0, Int32(v0), m0))
                        m1 = Int32(sel(Int32(v1) > m1, Int32(v1), m1))
                        m2 = Int32(sel(Int32(v2) > m2, Int32(v2), m2))
                        m3 = Int32(sel(Int32(v3) > m3, Int32(v3), m3))
            else:
                c0 = l0
                c1 = l1
                c2 = l2
                c3 = l3
            if const_expr(with_floors and clustered):
                c0 = sel(bin0 >= lo, c0, Int32(0))
                c1 = sel(bin0 + 1 >= lo, c1, Int32(0))
                c2 = sel(bin0 + 2 >= lo, c2, Int32(0))
                l0 = sel(bin0 >= lo, l0, Int32(0))
                l1 = sel(bin0 + 1 >= lo, l1, Int32(0))
                l2 = sel(bin0 + 2 >= lo, l2, Int32(0))
        if const_expr(one_warp):
            # (Every warp runs the shuffles; only warp 0 holds counts, and the others' stay 0.)
            incl = self.warp_incl_scan(c0 + c1 + c2 + c3)
            lincl = self.warp_incl_scan(l0 + l1 + l2 + l3)
            total = cute.arch.shuffle_sync(incl, WARP - 1)
            ltotal = cute.arch.shuffle_sync(lincl, WARP - 1)
            if tid == WARP - 1:
                # For every warp after the barrier below: misc[5] (the local k-th bin, pushed to the peers before
                # the select's cluster barrier) is free, and no scan of a second pass writes it.
                cute.arch.store(misc + 5, total)
        elif const_expr(clustered):
            incl, total, lincl, ltotal = self.block_scan2(c0 + c1 + c2 + c3, l0 + l1 + l2 + l3, scratch)
        else:
            # One CTA's counts are its own (l == c): one scan, without block_scan2's second one (every warp runs the
            # select, and the finish and the short-row kernel are bound by their instructions). Measured on the H200
            # (decode_topk_ab_h200.json: issue_cuts_s22_ab, candidate S): the local select 1050-1090 -> 770-800 cycles;
            # the short-row kernel 5 % faster (1 x 8K on DeepGEMM logits 4.57 -> 4.26 us), routed long rows 1.5 %.
            incl, total = self.block_scan(c0 + c1 + c2 + c3, scratch)
            lincl = incl
            ltotal = total
        above = total - incl
        labove = ltotal - lincl
        # Bins from high to low: exactly one bin has above < krem <= above + count.
        for q in cutlass.range_constexpr(3, -1, -1):
            cq = (c0, c1, c2, c3)[q]
            lq = (l0, l1, l2, l3)[q]
            if above < krem:
                if krem <= above + cq:
                    cute.arch.store(misc + 0, bin0 + q)
                    cute.arch.store(misc + 1, above)
                    cute.arch.store(misc + 6, cq)
                    cute.arch.store(misc + 7, labove)
                    if const_expr(with_floors and clustered):
                        cute.arch.store(misc + 4, (e0, e1, e2, e3)[q])
                    if const_expr(with_max):
                        cute.arch.store(floors + 17, (m0, m1, m2, m3)[q])
            above = above + cq
            labove = labove + lq
        cute.arch.sync_threads()
        if const_expr(one_warp):
            total = cute.arch.load(misc + 5, Int32)
        return total

    @cute.jit
    def local_top_bin(self, hist: cute.Pointer, misc: cute.Pointer):
        """misc[11]: the highest bin of this CTA's histogram holding an item (left 0 if none; SELECT_WINDOW_BINS).
        The caller has put a CTA barrier after the histogram's atomics; this ends with one."""
        tid = cute.arch.thread_idx()[0]
        v0, v1, v2, v3 = ptx.ld_shared_v4_u32(smem_addr(hist + tid * 4))
        top = Int32(-1)
        for q, v in enumerate((v0, v1, v2, v3)):
            top = sel(v != Uint32(0), tid * 4 + q, top)
        for s in cutlass.range_constexpr(5):
            other = cute.arch.shuffle_sync_bfly(top, 1 << s)
            top = sel(other > top, other, top)
        if (cute.arch.lane_idx() == 0) & (top > 0):
            ptx.red_shared_max_s32(smem_addr(misc + 11), top)
        cute.arch.sync_threads()

    @cute.jit
    def local_kth_bin(self, hist: cute.Pointer, k: Int32, scratch: cute.Pointer, misc: cute.Pointer) -> Int32:
        """The bin of the k-th largest item in this CTA's histogram so far (0 if it holds fewer than k);
        misc[11] gets the highest bin holding an item (0 if none).

        The caller has put a CTA barrier after the histogram's atomics.
        """
        tid = cute.arch.thread_idx()[0]
        c0 = cute.arch.load(hist + tid * 4, Int32)
        c1 = cute.arch.load(hist + tid * 4 + 1, Int32)
        c2 = cute.arch.load(hist + tid * 4 + 2, Int32)
        c3 = cute.arch.load(hist + tid * 4 + 3, Int32)
        if tid == 0:
            cute.arch.store(misc + 5, Int32(0))
            cute.arch.store(misc + 11, Int32(0))
        own = c0 + c1 + c2 + c3
        incl, total = self.block_scan(own, scratch)
        above = total - incl
        if (above == 0) & (own > 0):
            # The one thread whose bins hold the highest item (nothing above them, something in them).
            top = sel(c3 > 0, Int32(3), sel(c2 > 0, Int32(2), sel(c1 > 0, Int32(1), Int32(0))))
            cute.arch.store(misc + 11, tid * 4 + top)
        for q in cutlass.range_constexpr(3, -1, -1):
            cq = (c0, c1, c2, c3)[q]
            if above < k:
                if k <= above + cq:
                    cute.arch.store(misc + 5, tid * 4 + q)
            above = above + cq
        cute.arch.sync_threads()
        return cute.arch.load(misc + 5, Int32)

    @cute.jit
    def list_item(self, s_key: cute.Pointer, s_idx: cute.Pointer, i: Int32, n: Int32):
        """(key, index) of list slot i, or (0, 0) past the n listed (key 0 matches no threshold)."""
        key = Uint32(0)
        idx = Int32(0)
        if i < n:
            key = cute.arch.load(s_key + i, Uint32)
            idx = cute.arch.load(s_idx + i, Int32)
        return key, idx

    @cute.jit
    def warp_small_prefix(self, cnt: Int32, bits: int):
        """Exclusive prefix sum over the warp's lanes of counts below 2**bits, and the warp's total.

        One ballot per bit of the count instead of a shuffle scan: the ballots are
        independent, so the chain is a few cycles instead of five shuffle latencies
        (the step-1 loops are latency-bound at one or two CTAs an SM).
        """
        lt = cute.arch.lanemask_lt()
        before = Int32(0)
        total = Int32(0)
        for b in cutlass.range_constexpr(bits):
            m = cute.arch.vote_ballot_sync(((cnt >> Int32(b)) & Int32(1)) != Int32(0))
            before = before + (Int32(cute.arch.popc(m & lt)) << Int32(b))
            total = total + (Int32(cute.arch.popc(m)) << Int32(b))
        return before, total

    @cute.jit
    def warp_atomic_base(self, total: Int32, counter: cute.Pointer, in_cta0: bool = False) -> Int32:
        """One shared-memory atomic add of a warp-uniform total (by lane 0) on counter, or with in_cta0 on
        the same word of CTA 0 of the cluster; every lane gets the old value."""
        base = Int32(0)
        if cute.arch.lane_idx() == 0:
            if total > 0:
                if const_expr(in_cta0 and self.cluster > 1):
                    base = Int32(ptx.atom_add_cluster_u32(ptx.mapa_shared(smem_addr(counter), Int32(0)),
                                                          Uint32(total)))
                else:
                    base = cute.arch.atomic_add(counter, total)
        return cute.arch.shuffle_sync(base, 0)

    @cute.jit
    def load_slots(self, s_key: cute.Pointer, s_idx: cute.Pointer, i0: Int32, n: Int32, keys: cute.Tensor,
                   idxs: cute.Tensor) -> Int32:
        """Keys and indices of list slots i0 .. i0 + V - 1 (V = keys' size, 4 or 8; i0 a multiple of V,
        the list 16-byte aligned), and how many of them are below n.

        A thread at or past n reads slots 0 .. V - 1 instead (no branch; the caller's list
        holds them). Slots i0 < n are inside the list when n's region ends at a multiple of V.
        """
        n_valid = n - i0
        i_rd = Int32(sel(n_valid > 0, i0, Int32(0)))
        for h in cutlass.range_constexpr(cute.size(keys) // 4):
            k0, k1, k2, k3 = ptx.ld_shared_v4_u32(smem_addr(s_key + i_rd + 4 * h))
            x0, x1, x2, x3 = ptx.ld_shared_v4_u32(smem_addr(s_idx + i_rd + 4 * h))
            keys[4 * h], keys[4 * h + 1], keys[4 * h + 2], keys[4 * h + 3] = k0, k1, k2, k3
            idxs[4 * h], idxs[4 * h + 1], idxs[4 * h + 2], idxs[4 * h + 3] = x0, x1, x2, x3
        return n_valid

    @cute.jit
    def warp_incl_scan(self, x: Int32) -> Int32:
        """Inclusive prefix sum of x over the warp's lanes."""
        lane = cute.arch.lane_idx()
        for s in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(x, 1 << s)
            x = sel(lane >= (1 << s), x + y, x)
        return Int32(x)

    @cute.jit
    def warp_suffix_scan(self, x: Int32) -> Int32:
        """Inclusive suffix sum of x over the warp's lanes (this lane and those above it)."""
        lane = cute.arch.lane_idx()
        for s in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_down(x, 1 << s)
            x = sel(lane + (1 << s) < WARP, x + y, x)
        return Int32(x)

    @cute.jit
    def warp_kth_bin(self, hist: cute.Pointer, k: Int32, floor: Uint32) -> Int32:
        """The bin of the k-th largest item counted so far in the CTA's histogram, by one warp (0 if < k).

        Other warps may be adding to the histogram meanwhile: a count read early is
        only smaller, so the bin found is never above the true one, and still a bound.
        floor is an earlier answer (counts only grow: the new one is not below it), so a
        lane whose bins all lie below it reads none of them.
        """
        lane = cute.arch.lane_idx()
        per = self.bins // WARP
        assert per == 2 * WARP  # the search below takes two bins a lane
        base = lane * per
        mine = Int32(0)
        if Uint32(base + per) > floor:
            # 16-byte pieces in a lane-rotated order: lane l's block starts 256 bytes after
            # lane l - 1's, so reading the pieces in the same order would put all 32 lanes on
            # the same four banks (8x the wavefronts); rotated, each load takes the minimum 4.
            pieces = per // 4
            for t in cutlass.range(pieces, unroll=4):
                c = (lane + t) % pieces
                v0, v1, v2, v3 = ptx.ld_shared_v4_u32(smem_addr(hist + base + 4 * c))
                mine = mine + Int32((v0 + v1) + (v2 + v3))
        suffix = self.warp_suffix_scan(mine)
        ballot = cute.arch.vote_ballot_sync(suffix >= k)
        result = Int32(0)
        if ballot != 0:
            # The highest lane whose suffix reaches k holds the bin: the warp searches its
            # `per` bins together, two a lane from the top (a scan, not a serial walk).
            # Re-read counts can only be larger: the bin found is still a valid bound.
            top = Int32(31) - Int32(cute.arch.clz(Uint32(ballot)))
            run = cute.arch.shuffle_sync(suffix - mine, top)
            hi = top * per + per - 1 - 2 * lane
            c_hi = cute.arch.load(hist + hi, Int32)
            c_lo = cute.arch.load(hist + hi - 1, Int32)
            through_lo = run + self.warp_incl_scan(c_hi + c_lo)
            first = Uint32(cute.arch.vote_ballot_sync(through_lo >= k))
            # first != 0: the last pair ends at top's lowest bin, where the count reaches k.
            l_star = Int32(cute.arch.popc((first & (Uint32(0) - first)) - Uint32(1)))
            reached_hi = Uint32(cute.arch.vote_ballot_sync(through_lo - c_lo >= k))
            result = top * per + per - 1 - 2 * l_star
            result = sel((reached_hi >> Uint32(l_star)) & Uint32(1) != Uint32(0), result, result - 1)
            result = Int32(sel(result > 0, result, Int32(0)))
        return result

    @cute.jit
    def warp_filter(self, s_key: cute.Pointer, s_idx: cute.Pointer, n: Int32, bound: Uint32, shift: int,
                    vec: int = 1) -> Int32:
        """Keep a warp's list segment's items with first digit >= bound, in place and in order.

        A lane takes `vec` consecutive slots an iteration (vector loads for vec 4 or 8; the
        segment's base and capacity are multiples of LIST_VEC): fewer iterations of the
        scan chain, at the cost of 2 * vec registers (vec 1 inside the step-1 loop).
        In place is safe: an item moves down, and every slot an iteration writes was
        read by the warp before the iteration's scan.
        """
        lane = cute.arch.lane_idx()
        kept = Int32(0)
        keys = cute.make_rmem_tensor(vec, Uint32)
        idxs = cute.make_rmem_tensor(vec, Uint32)
        for ib in cutlass.range(0, n, WARP * vec):
            i0 = ib + lane * vec
            n_valid = n - i0
            if const_expr(vec == 1):
                key, idx = self.list_item(s_key, s_idx, i0, n)
                keys[0] = key
                idxs[0] = Uint32(idx)
            else:
                self.load_slots(s_key, s_idx, i0, n, keys, idxs)
            cnt = Int32(0)
            for j in cutlass.range_constexpr(vec):
                cnt = cnt + sel((n_valid > j) & ((keys[j] >> Uint32(shift)) >= bound), Int32(1), Int32(0))
            before, total = self.warp_small_prefix(cnt, count_bits(vec))
            pos = kept + before
            for j in cutlass.range_constexpr(vec):
                if (n_valid > j) & ((keys[j] >> Uint32(shift)) >= bound):
                    cute.arch.store(s_key + pos, keys[j])
                    cute.arch.store(s_idx + pos, Int32(idxs[j]))
                    pos = pos + 1
            kept = kept + total
        return kept

    @cute.jit
    def load_warp_tile(self, row_addr: Int64, gb: Int32, end: Int32, rraw: cute.Tensor):
        """FP32 token warp loop: lane l's columns 8 gb + 4 l + (0..3) into rraw[0:4] and 8 gb + 128 + 4 l + (0..3)
        into rraw[4:8], those before column `end` only.

        Each 16-byte load instruction of the warp then reads 512 contiguous bytes (a lane's
        8 contiguous columns would leave half of every 32-byte sector to the other load:
        twice the sectors through L2, as ncu counts them). Nothing is used here.
        """
        lane = cute.arch.lane_idx()
        for h in cutlass.range_constexpr(2):
            c = self.tile_item_column(gb, lane, 4 * h)
            addr = row_addr + Int64(c) * 4
            if c + 4 <= end:
                rraw[4 * h], rraw[4 * h + 1], rraw[4 * h + 2], rraw[4 * h + 3] = ptx.ld_global_nc_v4_u32(addr)
            else:
                for j in cutlass.range_constexpr(4):
                    if c + j < end:
                        rraw[4 * h + j] = ptx.ld_global_nc_u32(addr + j * 4)

    def tile_item_valid(self, v_lo: Int32, v_hi: Int32, j: int):
        """Whether item j (0..7) of a load_warp_tile tile lies before its end (plain Python: traced inline)."""
        return (v_lo if j < 4 else v_hi) > j % 4

    def tile_item_column(self, gb: Int32, lane: Int32, j: int) -> Int32:
        """The column of item j (0..7) of the load_warp_tile tile at group gb in this lane (traced inline)."""
        return gb * 8 + 128 * (j // 4) + 4 * lane + j % 4

    @cute.jit
    def half_counts(self, rraw: cute.Tensor, v_lo: Int32, v_hi: Int32, thr: Uint32):
        """load_warp_tile's two halves: each half's passing items in this lane, the warp's passing items of the
        half in lanes below, and the warp's total of the half (v_lo, v_hi: the half's valid columns).

        passing_count over each half with its own validity would do the same with two fast-path
        branches instead of one (and other cubins)."""
        c_lo = Int32(0)
        c_hi = Int32(0)
        if v_hi >= 4:
            c_lo = Int32(pairwise_sum([ptx.f32_geu(rraw[j], thr) for j in range(4)]))
            c_hi = Int32(pairwise_sum([ptx.f32_geu(rraw[4 + j], thr) for j in range(4)]))
        else:
            for j in cutlass.range_constexpr(4):
                c_lo = c_lo + sel(j < v_lo, ptx.f32_geu(rraw[j], thr), Int32(0))
                c_hi = c_hi + sel(j < v_hi, ptx.f32_geu(rraw[4 + j], thr), Int32(0))
        b_lo, t_lo = self.warp_small_prefix(c_lo, 3)
        b_hi, t_hi = self.warp_small_prefix(c_hi, 3)
        return b_lo, t_lo, b_hi, t_hi

    @cute.jit
    def shared_bound(self, s_hist: cute.Pointer, s_misc: cute.Pointer, k: Int32, it: Int32, warp: Int32,
                     bound: Uint32):
        """The warp loop's bound raised to the CTA's shared one (misc[12]); on its turn (every
        BOUND_SHARE_PERIOD iterations, staggered over the warps) a warp first recomputes that from
        the histogram. Returns (bound, thr).

        A warp's own refresh waits for its segment to fill, which on long slices leaves the
        bound far below the CTA's k-th largest so far (a third of the items passed on 1 x 1M);
        one warp's refresh serves every warp. Every value is a bound (the k-th largest of
        items counted so far), so a read racing with the atomic max is safe (a stale value is
        a lower bound); the shared and a warp's own bound only rise.
        """
        if (it + warp) % BOUND_SHARE_PERIOD == 0:
            mine = Uint32(self.warp_kth_bin(s_hist, k, bound))
            if cute.arch.lane_idx() == 0:
                cute.arch.atomic_max(s_misc + 12, Int32(mine))
            bound = Uint32(sel(mine > bound, mine, bound))
        shared = Uint32(cute.arch.load(s_misc + 12, Int32))
        bound = Uint32(sel(shared > bound, shared, bound))
        return bound, self.pass_threshold(bound)

    @cute.jit
    def step1_warp(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, k: Int32, s_hist: cute.Pointer,
                   s_key: cute.Pointer, s_idx: cute.Pointer, s_warp: cute.Pointer, s_scan: cute.Pointer,
                   s_misc: cute.Pointer, rraw: cute.Tensor, rnext: cute.Tensor, rnext2: cute.Tensor,
                   rkeys: cute.Tensor):
        """Step 1 by independent warps; returns (n_list, ok) with the list contiguous and in index order,
        and the CTA's k-th largest bin in misc[5] (its first scan scratch buffer used).

        Warp w reads the w-th contiguous part of the slice (32 groups at a time) into its
        own list segment, so warps never wait for each other; the segments, each in index
        order and in warp order along the row, are packed at the end. Per item the loop
        costs one float compare with a threshold (pass_threshold of the warp's bound);
        the items that pass are written in index order (one warp scan) and then handled
        densely (exact key, histogram).
        """
        tid = cute.arch.thread_idx()[0]
        lane = tid % WARP
        warp = tid // WARP
        W = self.warps
        seg_cap = self.cap // W
        shift0 = self.key_bits - self.digits[0]
        per_w = (g_hi - g_lo + W - 1) // W
        w_lo = Int32(sel(g_lo + warp * per_w < g_hi, g_lo + warp * per_w, g_hi))
        w_hi = Int32(sel(w_lo + per_w < g_hi, w_lo + per_w, g_hi))
        seg = warp * seg_cap
        n_w = Int32(0)
        bound = Uint32(0)
        thr = self.pass_threshold(bound)
        ok = Int32(1)
        # FP32 token mode compares the loaded bits themselves: no copy (registers are tight),
        # and reads lane-contiguous 16-byte pieces (load_warp_tile): the warp's 256 columns of
        # an iteration are two halves of 128, each in lane order, so items are listed in index
        # order half by half.
        contig = self.dtype == "f32" and not self.block_mode
        rvals = rkeys
        if const_expr(contig):
            rvals = rraw
        end_w = sel(w_hi * 8 < row_end, w_hi * 8, row_end)
        if const_expr(contig):
            self.load_warp_tile(row_addr, w_lo, end_w, rnext)
            self.load_warp_tile(row_addr, w_lo + WARP, end_w, rnext2)
        else:
            self.prime_loads(row_addr, w_lo + lane, WARP, w_hi, row_end, rnext, rnext2)
        cute.arch.sync_threads()  # the kernel's zeroing of the histograms, before any atomic
        for gb in cutlass.range(w_lo, w_hi, WARP):
            g = gb + lane
            if const_expr(self.cluster in BOUND_SHARE_CLUSTERS and not self.block_mode):
                bound, thr = self.shared_bound(s_hist, s_misc, k, (gb - w_lo) // WARP, warp, bound)
            if const_expr(contig):
                self.rotate_loads(rraw, rnext, rnext2)
                self.load_warp_tile(row_addr, gb + 2 * WARP, end_w, rnext2)
                v_lo = end_w - (gb * 8 + 4 * lane)
                v_hi = v_lo - 128
                before, t_lo, b_hi, t_hi = self.half_counts(rraw, v_lo, v_hi, thr)
                tot = t_lo + t_hi
            else:
                self.next_loads(row_addr, g + 2 * WARP, w_hi, row_end, rraw, rnext, rnext2)
                n_valid = self.group_items(g, w_hi, row_end)
                self.filter_values(rraw, g, w_hi, row_end, rvals)
                cnt, before, tot = self.passing_count(rvals, n_valid, thr)
            if ok != 0:
                if n_w + tot > seg_cap:
                    bound = Uint32(self.warp_kth_bin(s_hist, k, bound))
                    n_w = self.warp_filter(s_key + seg, s_idx + seg, n_w, bound, shift0)
                    thr = self.pass_threshold(bound)
                    if const_expr(contig):
                        before, t_lo, b_hi, t_hi = self.half_counts(rraw, v_lo, v_hi, thr)
                        tot = t_lo + t_hi
                    else:
                        cnt, before, tot = self.passing_count(rvals, n_valid, thr)
                    if n_w + tot > seg_cap:
                        ok = Int32(0)
            if ok != 0:
                # Passing items go to the segment in index order (lane, then column), then the
                # warp reads them back densely: exact keys and the histogram, no per-item divergence.
                if const_expr(contig):
                    pos = seg + n_w + before
                    pos_hi = seg + n_w + t_lo + b_hi
                    for j in cutlass.range_constexpr(8):
                        if const_expr(j == 4):
                            pos = pos_hi
                        if self.tile_item_valid(v_lo, v_hi, j) & (ptx.f32_geu(rraw[j], thr) != 0):
                            cute.arch.store(s_key + pos, rraw[j])
                            cute.arch.store(s_idx + pos, self.tile_item_column(gb, lane, j))
                            pos = pos + 1
                else:
                    pos = seg + n_w + before
                    for j in cutlass.range_constexpr(self.items):
                        if (j < n_valid) & (self.item_passes(rvals[j], thr) != 0):
                            cute.arch.store(s_key + pos, rvals[j])
                            cute.arch.store(s_idx + pos, self.item_index(g, j))
                            pos = pos + 1
                cute.arch.sync_warp()
                for s in cutlass.range(0, tot, WARP):
                    i = seg + n_w + s + lane
                    if s + lane < tot:
                        key = self.listed_key(cute.arch.load(s_key + i, Uint32))
                        if const_expr(not self.block_mode):
                            cute.arch.store(s_key + i, key)
                        if (key >> Uint32(shift0)) >= bound:
                            cute.arch.atomic_add(s_hist + Int32(key >> Uint32(shift0)), Int32(1))
                cute.arch.sync_warp()
                n_w = n_w + tot
            else:
                # The segment is full of items at or above the bound: count only (the later
                # steps re-read this CTA's slice from global memory).
                for j in cutlass.range_constexpr(self.items):
                    if const_expr(contig):
                        valid = self.tile_item_valid(v_lo, v_hi, j)
                    else:
                        valid = j < n_valid
                    if valid & (self.item_passes(rvals[j], thr) != 0):
                        key = self.listed_key(rvals[j])
                        if (key >> Uint32(shift0)) >= bound:
                            cute.arch.atomic_add(s_hist + Int32(key >> Uint32(shift0)), Int32(1))
        # The CTA's k-th largest bin (exact now: a barrier after every atomic) is a floor for
        # the row's threshold: the segments keep only the items at or above it, so the
        # list the later steps read (and CTA 0's room for the gathered finish) is short.
        cute.arch.sync_threads()
        final = Uint32(self.local_kth_bin(s_hist, k, s_scan, s_misc))  # -> misc[5]
        if ok != 0:
            n_w = self.warp_filter(s_key + seg, s_idx + seg, n_w, final, shift0, vec=LIST_VEC)
        if lane == 0:
            cute.arch.store(s_warp + warp, n_w)
            cute.arch.store(s_warp + 16 + warp, ok)
        cute.arch.sync_threads()
        # Lane v of every warp holds warp v's count: its exclusive prefix is v's place in the list.
        t_n = Int32(0)
        t_ok = Int32(1)
        if lane < W:
            t_n = cute.arch.load(s_warp + lane, Int32)
            t_ok = cute.arch.load(s_warp + 16 + lane, Int32)
        start = self.warp_incl_scan(t_n) - t_n
        n_list = cute.arch.shuffle_sync(start + t_n, WARP - 1)
        all_ok = t_ok
        for s in cutlass.range_constexpr(5):
            other = cute.arch.shuffle_sync_bfly(all_ok, 1 << s)
            all_ok = sel(other < all_ok, other, all_ok)
        all_ok = Int32(all_ok)
        if all_ok != 0:
            # Pack the segments: an item moves down (its place <= its slot), so in rounds of
            # increasing slots, with loads before stores, nothing unread is overwritten.
            per = 4
            rounds = (self.cap + per * self.threads - 1) // (per * self.threads)
            for r in cutlass.range_constexpr(rounds):
                for j in cutlass.range_constexpr(per):
                    p = r * per * self.threads + j * self.threads + tid
                    w = p // seg_cap
                    off = p - w * seg_cap
                    w_c = Int32(sel(w < W, w, Int32(0)))
                    n_of = cute.arch.shuffle_sync(t_n, w_c)
                    start_of = cute.arch.shuffle_sync(start, w_c)
                    valid = (w < W) & (off < n_of)
                    rkeys[j] = Uint32(0)
                    rraw[j] = Uint32(0xFFFFFFFF)
                    if valid:
                        rkeys[j] = cute.arch.load(s_key + p, Uint32)
                        rraw[j] = Uint32(cute.arch.load(s_idx + p, Int32))
                        rnext[j] = Uint32(start_of + off)
                cute.arch.sync_threads()
                for j in cutlass.range_constexpr(per):
                    if rraw[j] != Uint32(0xFFFFFFFF):
                        dest = Int32(rnext[j])
                        cute.arch.store(s_key + dest, rkeys[j])
                        cute.arch.store(s_idx + dest, Int32(rraw[j]))
                cute.arch.sync_threads()
        return n_list, all_ok

    def step1_by_tiles(self, n_groups: Int32):
        """Whether a slice of n_groups groups takes step 1's CTA tiles (under warp_min_groups: past the table's
        tiles where there is one), else the warp loop (traced inline)."""
        return n_groups < self.warp_min_groups

    @cute.jit
    def step1_tiles(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32,
                    s_hist: cute.Pointer, rraw: cute.Tensor, rnext: cute.Tensor, rnext2: cute.Tensor,
                    rkeys: cute.Tensor, s_tl: cute.Pointer, table: Int32, staging: Int32, k: Int32,
                    s_scan: cute.Pointer, s_misc: cute.Pointer, s_win: cute.Pointer, windowed, rkeep=None) -> Int32:
        """Step 1 of a short slice by CTA-wide tiles: the first digit's histogram of every item, no list. Returns
        refine_window's first bin (step1_tiles_bulk, where `windowed`), or -1 for a slice without a table.
        With rkeep, the first tile's keys stay there (the last tile's are in rkeys). staging: the shared address of the
        bulk-copy stages (step1_tiles_bulk; the candidate list's room). With a table (table_tiles),
        group g's table_key goes to its half-word (table_entry, from shared address `table`) for gather_marked.

        Listing a tile's items in index order puts a thread's 8 items in 8 consecutive slots:
        8-way bank conflicts on every store (ncu: 16384 shared wavefronts for 2048 ideal per
        store instruction), and with no bound yet on the first tiles every item is stored. The
        later steps re-read the slice instead (it is in L2 by then), or, for a slice of one tile,
        use the keys this loop leaves in rkeys (two tiles on one CTA an SM: the first in rkeep).
        Measured on the H200 (decode_topk_ab_h200.json: listless_ab, two_tiles_kept_ab): no list,
        0.4-1.1 us faster with one tile a CTA and 1.9-2.4 us with two (8 x 64K on 8 CTAs 12.9 -> 10.5 us,
        64 x 16K on 2 CTAs 14.0 -> 11.6 us); keeping one tile's keys in registers, 0.25-0.75 us more
        (64 x 8K on 2 CTAs 8.29 -> 7.55 us), two tiles' on 8 CTAs 0.9-1.0 us more (8 x 64K 10.25 -> 9.34).
        """
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        shift0 = self.key_bits - self.digits[0]
        # Raw-order bins where no keys are kept for the gather (more than two tiles): permuted after the loop.
        raw_bins = False
        if const_expr(self.raw_bins):
            raw_bins = g_hi - g_lo > 2 * T
        if raw_bins:
            if const_expr(self.bulk_stages > 0):
                if tid == 0:
                    self.start_bulk_tiles(row_addr, g_lo, g_hi, row_end, staging)
            else:
                # A running prefetch: the STEP1_PREFETCH_AHEAD tiles after the two in registers, one thread a tile
                # (the loop asks for one more each tile).
                if tid < STEP1_PREFETCH_AHEAD:
                    self.prefetch_tile(row_addr, g_lo + (2 + tid) * T, g_hi, row_end)
        else:
            # The whole slice is requested into L2 at once.
            piece = PREFETCH_PIECE_BYTES // (8 * self.elem_bytes)
            p0 = g_lo + tid * piece
            if p0 < g_hi:
                self.prefetch_groups(row_addr, p0, Int32(sel(p0 + piece < g_hi, p0 + piece, g_hi)), row_end)
        if not (raw_bins and self.bulk_stages > 0):
            self.prime_loads(row_addr, g_lo + tid, T, g_hi, row_end, rnext, rnext2)
        cute.arch.sync_threads()  # the kernel's zeroing of the histograms, before any atomic (and the mbarriers)
        window = Int32(-1)  # refine_window's first bin (-1: no table; -2: no window)
        if raw_bins:
            if const_expr(self.bulk_stages > 0):
                bulk = functools.partial(self.step1_tiles_bulk, row_addr, g_lo, g_hi, row_end, s_hist, rraw, rkeys,
                                         s_tl, table, staging, k, s_scan, s_misc, s_win)
                if const_expr(self.refine_window):
                    # The loop compiled with and without the window (a test a tile cost the latter 1-2.6 %).
                    if windowed:
                        window = bulk(True)
                    else:
                        window = bulk(False)
                else:
                    window = bulk(False)
            else:
                self.step1_tiles_raw(row_addr, g_lo, g_hi, row_end, s_hist, rraw, rnext, rnext2, rkeys, s_tl, table)
        else:
            for gb in cutlass.range(g_lo, g_hi, T):
                g = gb + tid
                self.next_loads(row_addr, g + 2 * T, g_hi, row_end, rraw, rnext, rnext2)
                full = False
                if const_expr(not self.block_mode):
                    full = (g < g_hi) & (g * 8 + 8 <= row_end)
                if full:
                    # A whole group (every group but the row's last): no column tests, and no key is 0 (so
                    # no test before the atomics). Measured on the H200 (decode_topk_ab_h200.json:
                    # full_group_ab): 1-4 us faster on 256K-1M rows (8 x 1M 32.7 -> 29.1 us), 0.1-0.4 us on short
                    # slices: step 1's CTA tiles are bound by their instructions, not by the loads in flight.
                    self.whole_group_keys(rraw, rkeys)
                    self.step1_mark(s_tl, 13, gb == g_lo)
                    for j in cutlass.range_constexpr(8):
                        cute.arch.atomic_add(s_hist + Int32(rkeys[j] >> Uint32(shift0)), Int32(1))
                else:
                    self.raw_to_items(rraw, g, g_hi, row_end, rkeys)
                    self.step1_mark(s_tl, 13, gb == g_lo)
                    for j in cutlass.range_constexpr(self.items):
                        if rkeys[j] != Uint32(0):
                            cute.arch.atomic_add(s_hist + Int32(rkeys[j] >> Uint32(shift0)), Int32(1))
                if const_expr(self.table_tiles > 0):
                    if g_hi - g_lo > 2 * T:  # (two tiles or fewer stay in registers: no table read)
                        # (gb - g_lo >= 0: an unsigned shift, not a signed division)
                        t = Int32(Uint32(gb - g_lo) // Uint32(T))
                        ptx.st_shared_u16(self.table_entry(table, t, tid), self.table_key(rkeys))
                if const_expr(rkeep is not None):
                    if gb == g_lo:
                        for j in cutlass.range_constexpr(self.items):
                            rkeep[j] = rkeys[j]
                self.step1_mark(s_tl, 14, gb == g_lo)
        return window

    @cute.jit
    def step1_tiles_raw(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, s_hist: cute.Pointer,
                        rraw: cute.Tensor, rnext: cute.Tensor, rnext2: cute.Tensor, rkeys: cute.Tensor,
                        s_tl: cute.Pointer, table: Int32):
        """step1_tiles' loop on a BF16 slice of more than two tiles (raw_bins; its loads primed; FP32:
        step1_tiles_bulk): the histogram by raw-order bins (raw_group_bins), then put in key order. No keys stay in
        registers: the gather re-reads the slice.
        (Measured slower on 8 and 16 CTAs, decode_topk_ab_h200.json: raw_bins_ab: three tiles an iteration in three
        register sets, none moved, 1.5-9.5 %; loads three or four tiles ahead, 1-3 % and 2-9 %.)"""
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        for gb in cutlass.range(g_lo, g_hi, T):
            g = gb + tid
            self.next_loads(row_addr, g + 2 * T, g_hi, row_end, rraw, rnext, rnext2)
            if tid == 0:
                self.prefetch_tile(row_addr, gb + (2 + STEP1_PREFETCH_AHEAD) * T, g_hi, row_end)
            self.raw_tile(g, gb, g_lo, g_hi, row_end, s_hist, rraw, rkeys, s_tl, table)
        self.raw_bins_to_key_order(s_hist)

    @cute.jit
    def raw_tile(self, g: Int32, gb: Int32, g_lo: Int32, g_hi: Int32, row_end: Int32, s_hist: cute.Pointer,
                 rraw: cute.Tensor, rkeys: cute.Tensor, s_tl: cute.Pointer, table: Int32):
        """One raw-bin tile of step 1 (thread's group g of tile gb, its raw bits in rraw): histogram and table.
        Returns the group's table entry."""
        tid = cute.arch.thread_idx()[0]
        top = Uint32(0)
        if (g < g_hi) & (g * 8 + 8 <= row_end):  # a whole group (every group but a row's last)
            top = self.raw_group_bins(rraw, rkeys, s_hist)
        else:
            self.raw_to_items(rraw, g, g_hi, row_end, rkeys)
            for j in cutlass.range_constexpr(8):
                if rkeys[j] != Uint32(0):
                    d = rkeys[j] >> Uint32(self.key_bits - self.digits[0])
                    cute.arch.atomic_add(s_hist + Int32(self.raw_bin_of_digit(d)), Int32(1))
            top = self.table_key(rkeys)
        self.step1_mark(s_tl, 13, gb == g_lo)
        if const_expr(self.table_tiles > 0):
            # (gb - g_lo >= 0: an unsigned shift, not a signed division)
            t = Int32(Uint32(gb - g_lo) // Uint32(self.threads))
            ptx.st_shared_u16(self.table_entry(table, t, tid), top)
        self.step1_mark(s_tl, 14, gb == g_lo)
        return top

    def bulk_bars(self, staging: Int32, stage, empty: bool) -> Int32:
        """Shared address of a bulk stage's full (or empty) mbarrier, behind the stages (traced inline)."""
        return staging + self.bulk_stages * self.tile_bytes + ((self.bulk_stages if empty else 0) + stage) * 8

    @cute.jit
    def bulk_tile(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, staging: Int32, t: Int32,
                  stage: Int32):
        """One thread: the slice's tile t (nothing past the slice) into its stage (t % bulk_stages) by one bulk copy,
        clipped to row_end (rounded up to 16 bytes: still inside the row, whose stride is a multiple of 16 bytes)."""
        T = self.threads
        g0 = g_lo + t * T
        if g0 < g_hi:
            g1 = Int32(sel(g0 + T < g_hi, g0 + T, g_hi))
            end = Int32(sel(g1 * 8 < row_end, g1 * 8, row_end))
            lo = g0 * 8 * self.elem_bytes
            nbytes = (end * self.elem_bytes + 15) // 16 * 16 - lo
            full = self.bulk_bars(staging, stage, False)
            ptx.mbarrier_arrive_expect_tx(full, nbytes)
            ptx.bulk_copy_global_to_shared(staging + stage * self.tile_bytes, row_addr + Int64(lo), nbytes, full,
                                           evict_first=self.stream_evict_first)

    @cute.jit
    def start_bulk_tiles(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, staging: Int32):
        """Thread 0: the stages' mbarriers (full: one arrival and the bytes; empty: every thread's), then the first
        tiles' copies (a CTA barrier follows before any wait)."""
        S = self.bulk_stages
        for q in cutlass.range_constexpr(S):
            ptx.mbarrier_init(self.bulk_bars(staging, q, False), 1)
            ptx.mbarrier_init(self.bulk_bars(staging, q, True), self.threads)
        ptx.fence_mbarrier_init_cluster()
        for q in cutlass.range_constexpr(S):
            self.bulk_tile(row_addr, g_lo, g_hi, row_end, staging, Int32(q), Int32(q))

    @cute.jit
    def step1_tiles_bulk(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, s_hist: cute.Pointer,
                         rraw: cute.Tensor, rkeys: cute.Tensor, s_tl: cute.Pointer, table: Int32, staging: Int32,
                         k: Int32, s_scan: cute.Pointer, s_misc: cute.Pointer, s_win: cute.Pointer,
                         windowed: bool) -> Int32:
        """step1_tiles_raw's loop with the tiles in shared memory (bulk_stages stages, started by start_bulk_tiles):
        each thread waits for its tile's stage, reads its group, and arrives on the stage's empty barrier; thread 0
        refills the previous tile's stage once every thread has read it. The mbarriers end with the loop.
        With refine_window and `windowed` (compile-time; the same choice on every CTA of the cluster), the first tile
        places the window (refine_window_base, returned; else -2: no window) and every group's table entry in it is
        counted there."""
        T = self.threads
        S = self.bulk_stages
        tid = cute.arch.thread_idx()[0]
        # The tile's stage and mbarrier phase, and the previous tile's, carried from tile to tile (t % S and t // S
        # would take a division by S each).
        stage = Int32(0)
        phase = Int32(0)
        prev_stage = Int32(S - 1)
        prev_phase = Int32(1)
        window = Int32(-2)
        for gb in cutlass.range(g_lo, g_hi, T):
            t = Int32(Uint32(gb - g_lo) // Uint32(T))
            if (tid == 0) & (t > 0):
                ptx.mbarrier_wait_parity(self.bulk_bars(staging, prev_stage, True), prev_phase, cluster=False)
                self.bulk_tile(row_addr, g_lo, g_hi, row_end, staging, t - 1 + S, prev_stage)
            ptx.mbarrier_wait_parity(self.bulk_bars(staging, stage, False), phase, cluster=False)
            src = staging + stage * self.tile_bytes + tid * (8 * self.elem_bytes)
            rraw[0], rraw[1], rraw[2], rraw[3] = ptx.ld_shared_v4_u32(src)
            if const_expr(self.dtype == "f32"):
                rraw[4], rraw[5], rraw[6], rraw[7] = ptx.ld_shared_v4_u32(src + 16)
            ptx.mbarrier_arrive(self.bulk_bars(staging, stage, True))
            top = self.raw_tile(gb + tid, gb, g_lo, g_hi, row_end, s_hist, rraw, rkeys, s_tl, table)
            if const_expr(self.refine_window and windowed):
                if t == 0:
                    window = self.refine_window_base(g_lo, g_hi, row_end, k, s_hist, s_scan, s_misc)
                d = Int32(top) - (window << Int32(TABLE_KEY_BITS - self.digits[0]))
                ptx.red_shared_add_if(smem_addr(s_win) + d * 4, Int32(1),
                                      sel(Uint32(d) < Uint32(REFINE_WINDOW_BINS * 32), Int32(1), Int32(0)))
            prev_stage = stage
            prev_phase = phase
            wrap = stage == S - 1
            stage = Int32(sel(wrap, Int32(0), stage + 1))
            phase = phase ^ sel(wrap, Int32(1), Int32(0))
        self.raw_bins_to_key_order(s_hist)  # (its first barrier: every thread is past its waits)
        if tid < 2 * S:
            ptx.mbarrier_inval(self.bulk_bars(staging, tid, False))  # (full ones, then empty ones: bulk_bars' order)
        return window

    @cute.jit
    def refine_window_base(self, g_lo: Int32, g_hi: Int32, row_end: Int32, k: Int32, s_hist: cute.Pointer,
                           s_scan: cute.Pointer, s_misc: cute.Pointer) -> Int32:
        """After the slice's first tile (its histogram in raw order): refine_window's first bin, REFINE_WINDOW_BINS / 2
        below the highest first-digit bin from which the tile holds e + 8 items, e its expected share of the k /
        cluster items the slice gives the row (that bin's neighbourhood holds the row's threshold bin but for a
        slice unlike its first tile). Three CTA barriers; misc[12] (free in the tile loop) carries the bin."""
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        cute.arch.sync_threads()  # the first tile's histogram adds
        pos, (v0, v1, v2, v3) = self.thread_raw_bins(s_hist)  # this thread's key bins 4t .. 4t + 3
        bins = [Int32(sel(pos, v, w)) for v, w in ((v0, v3), (v1, v2), (v2, v1), (v3, v0))]
        own = bins[0] + bins[1] + bins[2] + bins[3]
        incl, total = self.block_scan(own, s_scan)
        items = Int32(sel(g_hi * 8 < row_end, g_hi * 8, row_end)) - g_lo * 8
        want = (T * 8 * k + self.cluster * items - 1) // (self.cluster * items) + 8
        above = total - incl  # the tile's items in the bins above this thread's
        if (above < want) & (above + own >= want):  # the thread whose bins reach want
            b = Int32(-1)
            for j in cutlass.range_constexpr(3, -1, -1):
                b = sel((b < 0) & (above + bins[j] >= want), tid * 4 + j, b)
                above = above + bins[j]
            b = b - REFINE_WINDOW_BINS // 2
            cute.arch.store(s_misc + 12, sel(b > 0, b, Int32(0)))
        cute.arch.sync_threads()
        window = cute.arch.load(s_misc + 12, Int32)  # (0 where the tile holds fewer: the lowest bins)
        cute.arch.sync_threads()  # every read before the store below
        if tid == 0:
            cute.arch.store(s_misc + 12, Int32(0))  # (zero again, as the kernel's start left it)
        return window

    def table_key(self, rkeys: cute.Tensor) -> Uint32:
        """The top TABLE_KEY_BITS of a group's largest key (step 1's table entry; traced inline)."""
        top = rkeys[0]
        for j in range(1, self.items):
            top = sel(rkeys[j] > top, rkeys[j], top)
        return Uint32(top) >> Uint32(self.key_bits - TABLE_KEY_BITS)

    def raw_to_table_key(self, m: Uint32) -> Uint32:
        """The table entry of raw top TABLE_KEY_BITS bits m of a group's largest value (traced inline): a negative
        value's bits flipped, a positive value's sign bit set (key_of's order, away from NaN and -0)."""
        return m ^ (Uint32(0x8000) | ((m >> Uint32(15)) * Uint32(0x7FFF)))

    def raw_bin_of_digit(self, d: Uint32) -> Uint32:
        """Raw-order bin of first-digit d (11 bits; traced inline): a positive value's raw top 11 bits are its key
        digit less 1024, a negative value's are 2047 less it (the key flips every bit of a negative one)."""
        return sel(d >= Uint32(1024), d - Uint32(1024), Uint32(2047) - d)

    @cute.jit
    def raw_group_bins(self, rraw: cute.Tensor, rkeys: cute.Tensor, s_hist: cute.Pointer) -> Uint32:
        """Step 1's histogram adds of a whole token-mode group by raw-order bin (raw_bins); returns its table entry
        (table_key of its largest column). Raw bits order like keys except NaN (-> -inf) and -0 (-> +0): a group
        holding either takes its keys, each key digit mapped to its raw-order bin (one setp a value finds both, and
        +0, which would not need them)."""
        special = Int32(0)
        if const_expr(self.dtype == "bf16"):
            special = ptx.any_zero_or_nan_bf16x2(rraw[0], rraw[1], rraw[2], rraw[3])
        else:
            special = ptx.any_zero_or_nan_f32(*[rraw[j] for j in range(8)])
        top = Uint32(0)
        if special == Int32(0):
            m = Uint32(0)
            if const_expr(self.dtype == "bf16"):
                for p in cutlass.range_constexpr(4):
                    r = rraw[p]
                    cute.arch.atomic_add(s_hist + Int32((r >> Uint32(5)) & Uint32(0x7FF)), Int32(1))
                    cute.arch.atomic_add(s_hist + Int32(r >> Uint32(21)), Int32(1))
                m = ptx.max_bf16x2(ptx.max_bf16x2(rraw[0], rraw[1]), ptx.max_bf16x2(rraw[2], rraw[3]))
                m = ptx.max_bf16x2(m, m >> Uint32(16)) & Uint32(0xFFFF)
            else:
                for j in cutlass.range_constexpr(8):
                    cute.arch.atomic_add(s_hist + Int32(rraw[j] >> Uint32(21)), Int32(1))
                m = ptx.max_f32_bits(ptx.max_f32_bits(ptx.max_f32_bits(rraw[0], rraw[1]),
                                                      ptx.max_f32_bits(rraw[2], rraw[3])),
                                     ptx.max_f32_bits(ptx.max_f32_bits(rraw[4], rraw[5]),
                                                      ptx.max_f32_bits(rraw[6], rraw[7]))) >> Uint32(16)
            top = self.raw_to_table_key(m)
        else:
            for j in cutlass.range_constexpr(8):
                rkeys[j] = self.key_of(self.raw_column(rraw, j))
                d = rkeys[j] >> Uint32(self.key_bits - self.digits[0])
                cute.arch.atomic_add(s_hist + Int32(self.raw_bin_of_digit(d)), Int32(1))
            top = self.table_key(rkeys)
        return top

    @cute.jit
    def thread_raw_bins(self, s_hist: cute.Pointer):
        """The raw-order bins that hold this thread's key bins 4t..4t+3 (traced inline): raw bins 4t - 1024..
        (positive values, in key order) or 2044 - 4t.. (negative ones, in reverse), one 16-byte load; (pos, words)."""
        tid = cute.arch.thread_idx()[0]
        pos = tid * 4 >= 1024
        src = sel(pos, tid * 4 - 1024, 2044 - tid * 4)
        return pos, ptx.ld_shared_v4_u32(smem_addr(s_hist + src))

    @cute.jit
    def raw_bins_to_key_order(self, s_hist: cute.Pointer):
        """Step 1's raw-order histogram into key order, in place (thread_raw_bins)."""
        tid = cute.arch.thread_idx()[0]
        cute.arch.sync_threads()  # every add of the loop
        pos, (v0, v1, v2, v3) = self.thread_raw_bins(s_hist)
        cute.arch.sync_threads()  # every read before any write
        if pos:
            ptx.st_shared_v4_b32(smem_addr(s_hist + tid * 4), v0, v1, v2, v3)
        else:
            ptx.st_shared_v4_b32(smem_addr(s_hist + tid * 4), v3, v2, v1, v0)

    @cute.jit
    def slot_bases(self, rank: Int32, eq_word: cute.Pointer, gt_mine: Int32, s_misc: cute.Pointer,
                   eq_known: bool = False):
        """(eq_before, gt_base): threshold-equal items of lower ranks (lower columns), from their
        histogram word eq_word (or, eq_known, already in misc[4]), and this CTA's first slot for its
        gt_mine items above the threshold (one add on CTA 0's counter, so the CTAs' blocks of slots
        do not overlap)."""
        tid = cute.arch.thread_idx()[0]
        if const_expr(self.cluster > 1):
            if tid < WARP:
                if const_expr(not eq_known):
                    v = Int32(0)
                    if tid < rank:
                        v = Int32(ptx.ld_cluster_u32(ptx.mapa_shared(smem_addr(eq_word), tid)))
                    for s in cutlass.range_constexpr(5):
                        v = v + cute.arch.shuffle_sync_bfly(v, 1 << s)
                    if tid == 0:
                        cute.arch.store(s_misc + 4, v)
                if tid == 0:
                    counter = ptx.mapa_shared(smem_addr(s_misc + 2), Int32(0))
                    cute.arch.store(s_misc + 8, Int32(ptx.atom_add_cluster_u32(counter, Uint32(gt_mine))))
            cute.arch.sync_threads()
        return cute.arch.load(s_misc + 4, Int32), cute.arch.load(s_misc + 8, Int32)

    @cute.jit
    def push_gathered(self, s_key: cute.Pointer, s_idx: cute.Pointer, dst: Int32, key: Uint32, idx: Int32,
                      s_misc: cute.Pointer):
        """One threshold-bin item into slot dst of CTA 0's list (its own list for CTA 0); on large clusters by st.async,
        completing on CTA 0's push mbarrier (push_bar)."""
        if const_expr(self.async_pushes):
            bar = self.push_bar(s_misc)
            ptx.st_async_b32(ptx.mapa_shared(smem_addr(s_key + dst), Int32(0)), key, bar)
            ptx.st_async_b32(ptx.mapa_shared(smem_addr(s_idx + dst), Int32(0)), Uint32(idx), bar)
        elif const_expr(self.cluster > 1):
            ptx.st_cluster_b32(ptx.mapa_shared(smem_addr(s_key + dst), Int32(0)), key)
            ptx.st_cluster_b32(ptx.mapa_shared(smem_addr(s_idx + dst), Int32(0)), Uint32(idx))
        else:
            cute.arch.store(s_key + dst, key)
            cute.arch.store(s_idx + dst, idx)

    @cute.jit
    def push_list_staged(self, n_list: Int32, b0: Int32, dst_base: Int32, gt_mine: Int32, s_hist: cute.Pointer,
                         s_key: cute.Pointer, s_idx: cute.Pointer, s_misc: cute.Pointer, out_row: cute.Pointer,
                         rkeys: cute.Tensor, rraw: cute.Tensor) -> Int32:
        """gather_list's pushes on a large cluster; returns the warp's first output slot for its items above
        the bin. The CTA's output slots (gt_mine of them, exact): one add on the row's counter in CTA 0,
        issued first so that its round trip overlaps the pass (one a warp queued up at CTA 0: 1-3K
        cycles on 16 CTAs). The items of the bin are staged here, then copied to CTA 0 densely (a DSMEM
        store of a few lanes each otherwise), unless too many for the stage."""
        tid = cute.arch.thread_idx()[0]
        gt_base = Int32(0)
        if tid == 0:
            gt_base = Int32(ptx.atom_add_cluster_u32(ptx.mapa_shared(smem_addr(s_misc + 2), Int32(0)),
                                                     Uint32(gt_mine)))
        stage, staged = self.push_stage(s_hist, b0)
        n_above = self.gather_list(n_list, Uint32(b0), dst_base, s_key, s_idx, s_misc, out_row, rkeys, rraw,
                                   pushes=True, slot0=Int32(0), stage=stage, staged=staged)
        if tid == 0:
            cute.arch.store(s_misc + 8, gt_base)
        cute.arch.sync_threads()  # the stage and misc[8], misc[10] written
        if staged:
            self.push_staged(stage, stage + GATHER_STAGE, cute.arch.load(s_misc + 10, Int32), s_key, s_idx, dst_base,
                             s_misc)
        return cute.arch.load(s_misc + 8, Int32) + self.warp_atomic_base(n_above, s_misc + 9)

    def push_stage(self, s_hist: cute.Pointer, b0):
        """Where a CTA stages its items of bin b0 for CTA 0 (keys at the stage, indices GATHER_STAGE words after: the
        second histogram buffer, unused by then) and whether they fit there (traced inline)."""
        return s_hist + self.bins, cute.arch.load(s_hist + b0, Int32) <= GATHER_STAGE

    @cute.jit
    def push_staged(self, stage_key: cute.Pointer, stage_idx: cute.Pointer, n: Int32, s_key: cute.Pointer,
                    s_idx: cute.Pointer, dst: Int32, s_misc: cute.Pointer):
        """This CTA's n staged threshold-bin items (keys at stage_key, indices at stage_idx) to slots dst.. of CTA 0's
        list: consecutive lanes, consecutive words (a warp's DSMEM stores are dense, not a few lanes each)."""
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        for i in cutlass.range(tid, n, T):
            self.push_gathered(s_key, s_idx, dst + i, cute.arch.load(stage_key + i, Uint32),
                               Int32(cute.arch.load(stage_idx + i, Uint32)), s_misc)

    @cute.jit
    def gather_list(self, n_list: Int32, b0: Uint32, dst_base: Int32, s_key: cute.Pointer, s_idx: cute.Pointer,
                    s_misc: cute.Pointer, out_row: cute.Pointer, rkeys: cute.Tensor, ridx: cute.Tensor,
                    pushes: bool, slot0: Int32, stage: cute.Pointer = None, staged=None) -> Int32:
        """One pass over the list. pushes: this CTA's items in the first digit's bin b0 to CTA 0, and
        the warp's count of items above the bin (all its iterations) returned, for one reservation of
        output slots. Else (writes): those items to their output slots, from slot0 on, in the same order.

        An iteration is a chain of dependent steps (loads, ballots, a shared atomic, the
        stores), so a thread takes GATHER_VEC slots at once, T apart: for each of them the
        warp's lanes read consecutive slots and write consecutive destinations (one
        ballot each places them; DSMEM and global stores stay coalesced). The pushes take
        their list slots behind dst_base from this CTA's in-bin counter, one atomic a warp
        and iteration; the writes need none (the warp's block of slots is reserved). With
        staged, the pushes go to this CTA's staging area instead (keys at stage, indices
        GATHER_STAGE words after), in the same order, for push_staged to copy densely.
        """
        T = self.threads
        V = GATHER_VEC
        tid = cute.arch.thread_idx()[0]
        lt = cute.arch.lanemask_lt()
        shift0 = Uint32(self.key_bits - self.digits[0])
        n_above = Int32(0)
        slot = slot0
        for ib in cutlass.range(0, n_list, T * V):
            n_in = Int32(0)
            for j in cutlass.range_constexpr(V):
                # Slots past n_list read as key 0: bin 0, below every b0 (-inf's key is in bin 3).
                key, idx = self.list_item(s_key, s_idx, ib + j * T + tid, n_list)
                rkeys[j] = key
                ridx[j] = Uint32(idx)
                if const_expr(pushes):
                    n_in = n_in + Int32(cute.arch.popc(cute.arch.vote_ballot_sync((key >> shift0) == b0)))
                    n_above = n_above + Int32(cute.arch.popc(cute.arch.vote_ballot_sync((key >> shift0) > b0)))
            e = Int32(0)
            if const_expr(pushes):
                # Slots relative to the stage where there is one, else in CTA 0's list.
                e = self.warp_atomic_base(n_in, s_misc + 10)
                if const_expr(stage is None):
                    e = dst_base + e
            # The ballots again (cheaper than keeping V masks live).
            for j in cutlass.range_constexpr(V):
                if const_expr(pushes):
                    eq = (rkeys[j] >> shift0) == b0
                    m = cute.arch.vote_ballot_sync(eq)
                    if eq:
                        at = e + Int32(cute.arch.popc(m & lt))
                        if const_expr(stage is None):
                            self.push_gathered(s_key, s_idx, at, rkeys[j], Int32(ridx[j]), s_misc)
                        elif staged:
                            cute.arch.store(stage + at, rkeys[j])
                            cute.arch.store(stage + GATHER_STAGE + at, ridx[j])
                        else:
                            self.push_gathered(s_key, s_idx, dst_base + at, rkeys[j], Int32(ridx[j]), s_misc)
                    e = e + Int32(cute.arch.popc(m))
                else:
                    gt = (rkeys[j] >> shift0) > b0
                    m = cute.arch.vote_ballot_sync(gt)
                    if gt:
                        cute.arch.store(out_row + slot + Int32(cute.arch.popc(m & lt)), Int32(ridx[j]))
                    slot = slot + Int32(cute.arch.popc(m))
        return n_above

    @cute.jit
    def gather_slice(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, lo: Uint32, gt_base: Int32,
                     list_base: Int32, idx_delta: Int32, staged, s_misc: cute.Pointer,
                     out_row: cute.Pointer, rraw: cute.Tensor, rkeys: cute.Tensor, resident: int = 0, rkeep=None,
                     stash=None):
        """gather_list's pushes and writes for a CTA without a list (a short slice, or its list overflowed): one
        re-read of its slice; the items of the threshold bin from key lo on (its floor, or refined_floor's) to
        (list_base, idx_delta, staged) as in gather_group. resident 1: the slice is one tile whose items step 1 left
        in rkeys; 2: two tiles, the first in rkeep, the second in rkeys (none read). stash: with resident 2, this
        thread's shared address in a free array of 16 words a thread (gather_group's sparse split)."""
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        hi = self.bin_ceiling(lo)
        if const_expr(resident == 2):
            # Both tiles behind one pair of slot reservations (one chain of scan and atomics, not two). Measured on the
            # H200 (issue_cuts_s22_ab, candidate TU against T): 8 and 14 rows of 64K on 8 CTAs 3-4 % faster
            # (FP32 8 x 64K k512 7.38 -> 7.13 us), the rest within -0.7..+0.5 %.
            self.gather_group([(rkeep, g_lo + tid), (rkeys, g_lo + T + tid)], lo, hi, gt_base, list_base, idx_delta,
                              staged, s_misc, out_row, stash)
        else:
            for gb in cutlass.range(g_lo, g_hi, T):
                g = gb + tid
                if const_expr(resident == 0):
                    self.load_items(row_addr, g, g_hi, row_end, rraw, rkeys)
                self.gather_group([(rkeys, g)], lo, hi, gt_base, list_base, idx_delta, staged, s_misc, out_row)

    @cute.jit
    def gather_group(self, groups, lo: Uint32, hi: Uint32, gt_base: Int32, list_base: Int32,
                     idx_delta: Int32, staged, s_misc: cute.Pointer, out_row: cute.Pointer, stash=None):
        """The items of groups (a list of (keys, g): group g's items) above the bin [lo, hi) to the output from slot
        gt_base on, those in it to the keys from shared address list_base on (indices idx_delta bytes further): CTA
        0's list, or where `staged` (None: never) this CTA's stage, by plain shared stores (the cluster stores'
        generic addressing takes three times the instructions, and this code runs cold: instruction fetch was its
        largest stall). The warp's places come from this CTA's two counters (misc[9], misc[3]) for all the groups at
        once, then one split a group; with stash (SPARSE_SPLIT), one split of the masked items only."""
        gt = Int32(0)
        eq = Int32(0)
        marked = None  # (the sparse split's mask)
        if const_expr(stash is not None):
            marked, gt = self.stash_candidates(groups, lo, hi, stash)
            eq = Int32(cute.arch.popc(marked)) - gt
        else:
            for keys, _ in groups:
                gt_g, eq_g = self.count_in_bin(keys, lo, hi)
                gt = gt + gt_g
                eq = eq + eq_g
        slot, e = self.warp_slots2(gt, eq, s_misc + 9, s_misc + 3)
        list_addr = list_base + e * 4
        out_addr = out_row.toint() + Int64(gt_base + slot) * 4
        if const_expr(self.cluster == 1):
            self.split_items(groups, marked, stash, lo, hi, out_addr, list_addr, idx_delta)
        elif const_expr(staged is None):
            self.split_items(groups, marked, stash, lo, hi, out_addr, ptx.mapa_shared(list_addr, Int32(0)), idx_delta,
                             True, self.push_bar(s_misc))
        else:
            if staged:
                self.split_items(groups, marked, stash, lo, hi, out_addr, list_addr, idx_delta)
            else:
                self.split_items(groups, marked, stash, lo, hi, out_addr, ptx.mapa_shared(list_addr, Int32(0)),
                                 idx_delta, True, self.push_bar(s_misc))

    def split_items(self, groups, marked, stash, lo: Uint32, hi: Uint32, out_addr: Int64, list_addr: Int32,
                    idx_delta: Int32, to_cluster: bool = False, mbar=None):
        """gather_group's split: of the marked items from the stash (split_candidates), or else of every item of the
        groups (split_groups) (traced inline)."""
        if const_expr(stash is not None):
            self.split_candidates(groups[0][1], marked, stash, lo, hi, out_addr, list_addr, idx_delta, to_cluster,
                                  mbar)
        else:
            self.split_groups(groups, lo, hi, out_addr, list_addr, idx_delta, to_cluster, mbar)

    @cute.jit
    def stash_candidates(self, groups, lo: Uint32, hi: Uint32, stash: Int32):
        """(marked, gt): bit 8i + j of marked where item j of groups[i] is at or above lo (above the bin or in it),
        gt how many are at or above hi. Each group's 8 keys go to the thread's stash, quad q of group i at
        stash + (2i + q) * T * 16 (a warp's 16-byte stores side by side: no bank conflict)."""
        T = self.threads
        marked = Uint32(0)
        gt = Int32(0)
        for i, (keys, _) in enumerate(groups):
            for j in cutlass.range_constexpr(self.items):
                marked = marked | sel(keys[j] >= lo, Uint32(1 << (8 * i + j)), Uint32(0))
                gt = gt + sel(keys[j] >= hi, Int32(1), Int32(0))
            for q in cutlass.range_constexpr(2):
                ptx.st_shared_v4_b32(stash + (2 * i + q) * T * 16, keys[4 * q], keys[4 * q + 1], keys[4 * q + 2],
                                     keys[4 * q + 3])
        return marked, gt

    @cute.jit
    def split_candidates(self, g0: Int32, marked: Uint32, stash: Int32, lo: Uint32, hi: Uint32, out_addr: Int64,
                         list_addr: Int32, idx_delta: Int32, to_cluster: bool = False, mbar=None):
        """split_group of the marked items only, lowest first, each read back from the stash (stash_candidates):
        item j is item j % 8 of group g0 + (j // 8) * T. A warp runs as many rounds as its lane with the most."""
        T = self.threads
        for _ in cutlass.range(Int32(cute.arch.popc(marked)), unroll=1):
            lowest = marked & (Uint32(0) - marked)
            j = Int32(cute.arch.popc(lowest - Uint32(1)))
            marked = marked ^ lowest
            key = Uint32(ptx.ld_shared_s32(stash + (j >> 2) * (T * 16) + (j & 3) * 4))
            idx = (g0 + (j >> 3) * T) * 8 + (j & 7)
            out_addr, list_addr = ptx.split_by_bin(out_addr, list_addr, idx_delta, key, idx, hi, lo, to_cluster,
                                                   mbar)

    def split_groups(self, groups, lo: Uint32, hi: Uint32, out_addr: Int64, list_addr: Int32, idx_delta: Int32,
                     to_cluster: bool = False, mbar=None):
        """split_group over groups (a list of (keys, g)), each from where the one before stopped (traced inline)."""
        for keys, g in groups:
            out_addr, list_addr = self.split_group(keys, g, lo, hi, out_addr, list_addr, idx_delta, to_cluster, mbar)

    @cute.jit
    def gather_no_list(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, lo: Uint32, gt_base: Int32,
                       list_base: Int32, idx_delta: Int32, staged, s_misc: cute.Pointer, out_row: cute.Pointer,
                       rraw: cute.Tensor, rkeys: cute.Tensor, rkeep: cute.Tensor, rnext: cute.Tensor,
                       s_table: cute.Pointer, s_tl: cute.Pointer, tiles):
        """The gathered finish's pass of a CTA without a list: its slice's items above the threshold bin to the
        output from slot gt_base on, those in it from key lo on to list_base (gather_group): from the registers
        step 1 left where the slice is one tile (two on one CTA an SM), else by gather_rest."""
        T = self.threads
        stash = None  # (SPARSE_SPLIT: the table, not read by a slice still in registers)
        if const_expr(SPARSE_SPLIT and self.table_tiles > 0 and not self.block_mode
                      and self.cluster <= SPARSE_SPLIT_MAX_CLUSTER):
            stash = smem_addr(s_table) + cute.arch.thread_idx()[0] * 16
        if g_hi - g_lo <= T:  # one tile (or none): step 1's keys are still in rkeys
            self.gather_slice(row_addr, g_lo, g_hi, row_end, lo, gt_base, list_base, idx_delta, staged, s_misc,
                              out_row, rraw, rkeys, resident=1)
        else:
            two = False  # two tiles, the first kept in rkeep (one CTA an SM)
            if const_expr(self.ctas_per_sm == 1):
                two = g_hi - g_lo <= 2 * T
            if two:
                self.gather_slice(row_addr, g_lo, g_hi, row_end, lo, gt_base, list_base, idx_delta, staged, s_misc,
                                  out_row, rraw, rkeys, resident=2, rkeep=rkeep, stash=stash)
            else:
                self.gather_rest(row_addr, g_lo, g_hi, row_end, lo, gt_base, list_base, idx_delta, staged, s_misc,
                                 out_row, rraw, rkeys, s_table, s_tl, tiles, rnext)
        if const_expr(self.gather_marks):
            self.mark(s_tl, 15)

    @cute.jit
    def finish_low_bits(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, k: Int32, krem: Int32,
                        b0: Uint32, gt_mine: Int32, rank: Int32, s_hist: cute.Pointer, s_key: cute.Pointer,
                        s_idx: cute.Pointer, s_scan: cute.Pointer, s_misc: cute.Pointer, s_peer: cute.Pointer,
                        s_table: cute.Pointer, s_tl: cute.Pointer, out_row: cute.Pointer, rraw: cute.Tensor,
                        rkeys: cute.Tensor, rkeep: cute.Tensor, rnext: cute.Tensor):
        """low_bits_finish: the krem items still needed from first-digit bin b0 (output slots k - krem .. k - 1),
        every CTA its own. The pass stages the CTA's items of the bin (writing those above it); a 32-bin histogram of
        their last 5 key bits (in the table, read by then) is summed over the cluster after a barrier; bin b1 of the
        krem-th largest gives the resolved key. A CTA's items above b1 go to slots from k - krem plus the lower
        ranks' count above b1; its ties (key bits b1) to slots after all items above b1 plus the lower ranks' ties,
        all of them, none, or (the one CTA the cut falls in) its `take` lowest indices, ranked by finish_gathered
        over a copy of them."""
        T = self.threads
        C = self.cluster
        tid = cute.arch.thread_idx()[0]
        lane = cute.arch.lane_idx()
        gt_base = self.slot_bases(rank, s_hist + b0, gt_mine, s_misc, eq_known=True)[1]
        stage = s_hist + self.bins
        self.gather_no_list(row_addr, g_lo, g_hi, row_end, self.bin_bounds(b0)[0], gt_base, smem_addr(stage),
                            Int32(GATHER_STAGE * 4),
                            True, s_misc, out_row, rraw, rkeys, rkeep, rnext, s_table, s_tl, True)
        cute.arch.sync_threads()  # the stage, its count (misc[3]) and the table's last reads
        n = cute.arch.load(s_misc + 3, Int32)
        low = s_table  # 32 bins: the table is not read any more
        if tid < 32:
            cute.arch.store(low + tid, Int32(0))
        cute.arch.sync_threads()
        for i in cutlass.range(tid, n, T):
            cute.arch.atomic_add(low + Int32(cute.arch.load(stage + i, Uint32) & Uint32(31)), Int32(1))
        self.mark(s_tl, 5)
        self.cluster_arrive_own_smem()  # this CTA's bins, for the peers' reads below
        cute.arch.cluster_wait()
        self.mark(s_tl, 6)
        if tid < WARP:
            mine = cute.arch.load(low + lane, Int32)
            tot = Int32(0)
            bel = Int32(0)
            for r in cutlass.range(C, unroll=8):
                v = Int32(ptx.ld_cluster_u32(ptx.mapa_shared(smem_addr(low + lane), r)))
                tot = tot + v
                bel = bel + sel(r < rank, v, Int32(0))
            # Sums over the bins above each lane's (lanes are bins, the largest last).
            t_above = self.warp_suffix_scan(tot) - tot
            b_above = self.warp_suffix_scan(bel) - bel
            hit = Uint32(cute.arch.vote_ballot_sync((t_above < krem) & (krem <= t_above + tot)))
            b1 = Int32(31) - Int32(cute.arch.clz(hit))
            if lane == b1:
                cute.arch.store(s_peer + 18, b1)
                cute.arch.store(s_peer + 19, t_above)  # items of the cluster above b1
                cute.arch.store(s_peer + 21, b_above)  # the lower ranks' above b1
                cute.arch.store(s_peer + 22, bel)  # the lower ranks' ties
                cute.arch.store(s_peer + 23, mine)  # this CTA's ties
        # The peers' bins are read: the arrive lets them exit once this CTA is done too (the wait is last).
        cute.arch.cluster_arrive_relaxed()
        cute.arch.sync_threads()
        b1 = Uint32(cute.arch.load(s_peer + 18, Int32))
        above1 = cute.arch.load(s_peer + 19, Int32)
        ties_before = cute.arch.load(s_peer + 22, Int32)
        my_ties = cute.arch.load(s_peer + 23, Int32)
        take = krem - above1 - ties_before
        take = Int32(sel(take < 0, Int32(0), sel(take > my_ties, my_ties, take)))
        first = k - krem
        base_above = first + cute.arch.load(s_peer + 21, Int32)
        base_ties = first + above1 + ties_before
        all_ties = take == my_ties
        for ib in cutlass.range(0, n, T):
            i = ib + tid
            key = Uint32(0)
            idx = Int32(0)
            if i < n:
                key = cute.arch.load(stage + i, Uint32)
                idx = cute.arch.load(stage + GATHER_STAGE + i, Int32)
            low_bits = key & Uint32(31)
            above = (i < n) & (low_bits > b1)
            tie = (i < n) & (low_bits == b1)
            slot = base_above + self.warp_slot1(above, s_misc + 10)
            if above:
                cute.arch.store(out_row + slot, idx)
            if all_ties:
                slot = base_ties + self.warp_slot1(tie, s_misc + 15)
                if tie:
                    cute.arch.store(out_row + slot, idx)
            else:
                if take > 0:  # the cut: copy the ties for the ranking below
                    slot = self.warp_slot1(tie, s_misc + 15)
                    if tie:
                        cute.arch.store(s_key + slot, key)
                        cute.arch.store(s_idx + slot, idx)
        if (take > 0) & (take < my_ties):
            # Every thread is past its reads of the stage (finish_gathered zeroes the histograms first) and its
            # copies of the ties are written.
            cute.arch.sync_threads()
            self.finish_gathered(Int32(0), my_ties, take, base_ties, s_hist, s_key, s_idx, s_scan, s_misc, out_row,
                                 s_tl)
        self.mark(s_tl, 7)
        cute.arch.cluster_wait()

    @cute.jit
    def gather_rest(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, lo: Uint32, gt_base: Int32,
                    list_base: Int32, idx_delta: Int32, staged, s_misc: cute.Pointer,
                    out_row: cute.Pointer, rraw: cute.Tensor, rkeys: cute.Tensor, s_table: cute.Pointer,
                    s_tl: cute.Pointer, tiles, rnext: cute.Tensor):
        """The gather of a CTA without a list whose keys are not in registers: the groups step 1's table marks
        (CTA tiles, where there is a table), else the whole slice again (CTA tiles without a table, or the
        warp loop's list overflowed). tiles: step 1 ran by CTA tiles (step1_by_tiles); rnext: free registers for the
        marked gather's next round."""
        marked = False
        if const_expr(self.table_tiles > 0):
            marked = tiles
        if marked:
            self.gather_marked(row_addr, g_lo, g_hi, row_end, lo, gt_base, list_base, idx_delta, staged, s_misc,
                               out_row, rraw, rkeys, smem_addr(s_table), s_tl, rnext)
        else:
            self.gather_slice(row_addr, g_lo, g_hi, row_end, lo, gt_base, list_base, idx_delta, staged, s_misc,
                              out_row, rraw, rkeys)

    def table_entry(self, table: Int32, t: Int32, tid: Int32) -> Int32:
        """Shared address of thread tid's table half-word for tile t (traced inline): four tiles a thread in 8 bytes,
        so gather_marked reads a thread's 32 tiles with 8 loads (4-tile blocks of T x 8 bytes)."""
        return table + (t >> 2) * (self.threads * 8) + tid * 8 + (t & 3) * 2

    def warp_entry(self, table: Int32, warp: Int32, q: Int32) -> Int32:
        """Shared address of entry q of a warp's compacted list in gather_marked (traced inline): the warp's own
        256 bytes of each 4-tile block of the table (its lanes' entries, already read), 128 entries a block."""
        return table + (q >> 7) * (self.threads * 8) + warp * 256 + (q & 127) * 2

    @cute.jit
    def gather_marked(self, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32, lo: Uint32, gt_base: Int32,
                      list_base: Int32, idx_delta: Int32, staged, s_misc: cute.Pointer,
                      out_row: cute.Pointer, rraw: cute.Tensor, rkeys: cute.Tensor, table: Int32, s_tl: cute.Pointer,
                      rnext: cute.Tensor):
        """gather_slice for a slice of several tiles, re-reading only the groups that step 1's table marks as
        holding an item at or above key lo (the threshold bin's floor: about k / cluster items and the share of the
        bin from lo on of the slice).

        Each lane reads its groups' table entries (four tiles a load) into a bitmask of marked tiles; the warp
        packs the marked groups, lane by lane (a prefix sum of the lanes' counts, then a walk over each lane's
        set bits), into its own part of the table, already read, then takes them 32 at a time, one a lane (on up
        to PIPELINED_MARKS_MAX_CLUSTER CTAs with the next round's loads in flight during a round's split). A lane
        without a group takes one past g_hi (all keys 0: nothing stored).
        """
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        lane = cute.arch.lane_idx()
        warp = tid // WARP
        hi = self.bin_ceiling(lo)
        n_tiles = (g_hi - g_lo + T - 1) // T
        # A block (four tiles) a load, the next one's load issued before this one's compares (the last block is read
        # again at the end: harmless). Entries past n_tiles (stale) are masked off at the end.
        floor = lo >> Uint32(self.key_bits - TABLE_KEY_BITS)
        n_blocks = (n_tiles + 3) // 4
        nxt0, nxt1 = ptx.ld_shared_v2_b32(self.table_entry(table, Int32(0), tid))
        marks = Uint32(0)
        for j in cutlass.range(n_blocks):
            pair = (nxt0, nxt1)
            j_next = sel(j + 1 < n_blocks, j + 1, j)
            nxt0, nxt1 = ptx.ld_shared_v2_b32(self.table_entry(table, 4 * j_next, tid))
            for h in cutlass.range_constexpr(2):
                marks = marks | (self.entries_at_least(Uint32(pair[h]), floor) << Uint32(4 * j + 2 * h))
        marks = marks & sel(n_tiles >= 32, Uint32(0xFFFFFFFF), (Uint32(1) << Uint32(n_tiles)) - Uint32(1))
        cute.arch.sync_warp()  # every entry of the warp read before the packing overwrites them
        if const_expr(self.gather_marks):
            self.mark(s_tl, 13)
        count = Int32(cute.arch.popc(marks))
        through = self.warp_incl_scan(count)
        n = cute.arch.shuffle_sync(through, WARP - 1)
        q = through - count
        rest = marks
        for _ in cutlass.range(count):
            t = Int32(cute.arch.popc((rest & (Uint32(0) - rest)) - Uint32(1)))  # the lowest marked tile
            ptx.st_shared_u16(self.warp_entry(table, warp, q), t * T + tid)
            rest = rest & (rest - Uint32(1))
            q = q + 1
        cute.arch.sync_warp()
        if const_expr(self.gather_marks):
            self.mark(s_tl, 14)
        if const_expr(self.cluster <= PIPELINED_MARKS_MAX_CLUSTER):
            # Round r + 1's loads are issued before round r's split (none past the last round).
            g_next = self.marked_group(table, warp, lane, Int32(0), n, g_lo, g_hi)
            self.load_raw(row_addr, g_next, g_hi, row_end, rnext)
            for r in cutlass.range((n + WARP - 1) // WARP):
                g = g_next
                for j in cutlass.range_constexpr(8):
                    rraw[j] = rnext[j]
                g_next = self.marked_group(table, warp, lane, (r + 1) * WARP, n, g_lo, g_hi)
                self.load_raw(row_addr, g_next, g_hi, row_end, rnext)
                self.raw_to_items(rraw, g, g_hi, row_end, rkeys)
                self.gather_group([(rkeys, g)], lo, hi, gt_base, list_base, idx_delta, staged, s_misc, out_row)
        else:
            for r in cutlass.range((n + WARP - 1) // WARP):
                g = self.marked_group(table, warp, lane, r * WARP, n, g_lo, g_hi)
                self.load_items(row_addr, g, g_hi, row_end, rraw, rkeys)
                self.gather_group([(rkeys, g)], lo, hi, gt_base, list_base, idx_delta, staged, s_misc, out_row)

    @cute.jit
    def refined_floor(self, b0: Uint32, krem: Int32, with_table, table: Int32, n_tiles: Int32,
                      counts: cute.Pointer, s_tl: cute.Pointer, s_peer: cute.Pointer, s_win: cute.Pointer) -> Uint32:
        """The key from which the gathered finish takes threshold-bin items (refined_floor): bin b0's floor raised by
        the table's next 5 bits. A group whose largest key is in b0 holds an item at least that large, distinct from
        the items above the bin, so once krem groups' maxima reach a sub-bin (summed over the cluster), so does the
        krem-th largest item of the bin: every item it needs is at or above that sub-bin's floor.

        The counts: where every CTA's refine window holds b0 (refine_window), each warp sums the peers' window counts
        of b0 through distributed shared memory (final since the first digit's cluster barrier); else table_counts
        (with_table: this CTA's slice has a table, more than two tiles; counts zeroed at the kernel's start)."""
        tid = cute.arch.thread_idx()[0]
        lane = cute.arch.lane_idx()
        base = b0 << Uint32(TABLE_KEY_BITS - self.digits[0])  # bin b0's first table entry
        windowed = False
        if const_expr(self.refine_window):
            # Every CTA's window (s_peer[24 + r]; -1: no table, nothing to add; -2: none) holds bin b0: the same
            # decision on every CTA.
            windowed = True
            for r in cutlass.range_constexpr(self.cluster):
                w = cute.arch.load(s_peer + 24 + r, Int32)
                holds = (w >= 0) & (Int32(b0) >= w) & (Int32(b0) < w + REFINE_WINDOW_BINS)
                windowed = windowed & ((w == -1) | holds)
        total = Int32(0)
        if windowed:
            if const_expr(self.refine_window):
                for r in cutlass.range_constexpr(self.cluster):
                    w = cute.arch.load(s_peer + 24 + r, Int32)
                    if w >= 0:
                        at = smem_addr(s_win) + ((Int32(b0) - w) * 32 + lane) * 4
                        total = total + Int32(ptx.ld_cluster_u32(ptx.mapa_shared(at, Int32(r))))
        else:
            total = self.table_counts(base, with_table, table, n_tiles, counts, s_tl)
        # Lanes are sub-bins, the largest last: the maxima at or above each lane's, non-increasing over the lanes.
        enough = Uint32(cute.arch.vote_ballot_sync(self.warp_suffix_scan(total) >= krem))
        top = Uint32(sel(enough != Uint32(0), Uint32(31) - Uint32(cute.arch.clz(enough)), Uint32(0)))
        if const_expr(self.refine_marks):
            self.mark(s_tl, 14)
        return (base + top) << Uint32(self.key_bits - TABLE_KEY_BITS)

    @cute.jit
    def table_counts(self, base: Uint32, with_table, table: Int32, n_tiles: Int32, counts: cute.Pointer,
                     s_tl: cute.Pointer) -> Int32:
        """refined_floor's counts without a window: this CTA's groups' maxima in the bin from `base` on, by their
        next 5 bits, added into the 32 counts; one cluster barrier (its release orders the adds before the peers'
        reads), then this lane's sub-bin summed over the cluster by every warp itself (no CTA barrier)."""
        tid = cute.arch.thread_idx()[0]
        lane = cute.arch.lane_idx()
        if with_table:
            # One predicated add an entry (timeline_refine: 2.5-2.9K cycles for 32 tiles, about the same with the
            # entries in the bin picked out first, and 3.2K as a loop of two entries an iteration).
            at = smem_addr(counts)
            for j in cutlass.range((n_tiles + 3) // 4, unroll=2):
                w0, w1 = ptx.ld_shared_v2_b32(self.table_entry(table, 4 * j, tid))
                for h in cutlass.range_constexpr(4):
                    word = Uint32((w0, w1)[h // 2])
                    entry = (word >> Uint32(16)) if h % 2 else (word & Uint32(0xFFFF))
                    sub = entry - base  # (unsigned: an entry below the bin wraps past 31)
                    hit = (sub < Uint32(32)) & (4 * j + h < n_tiles)
                    ptx.red_shared_add_if(at + Int32(sub) * 4, Int32(1), sel(hit, Int32(1), Int32(0)))
        if const_expr(self.refine_marks):
            self.mark(s_tl, 13)
        self.cluster_arrive_own_smem()  # the counts, this CTA's shared memory
        cute.arch.cluster_wait()
        total = Int32(0)
        for r in cutlass.range(self.cluster, unroll=8):
            total = total + Int32(ptx.ld_cluster_u32(ptx.mapa_shared(smem_addr(counts + lane), r)))
        return total

    def entries_at_least(self, word: Uint32, floor: Uint32) -> Uint32:
        """Bits 0 and 1: whether the word's low and high table entries are at least floor (traced inline). Each
        half plus 2**16 - floor carries into bit 16 iff it is."""
        up = Uint32(0x10000) - floor
        low = ((word & Uint32(0xFFFF)) + up) >> Uint32(16)
        high = ((word >> Uint32(16)) + up) >> Uint32(15)
        return (low & Uint32(1)) | (high & Uint32(2))

    @cute.jit
    def marked_group(self, table: Int32, warp: Int32, lane: Int32, r0: Int32, n: Int32, g_lo: Int32,
                     g_hi: Int32) -> Int32:
        """This lane's group of the round starting at entry r0 of the warp's compacted marks (g_hi: none)."""
        g = g_hi
        e = r0 + lane
        if e < n:
            g = g_lo + Int32(ptx.ld_shared_u16(self.warp_entry(table, warp, e)))
        return g

    @cute.jit
    def finish_gathered(self, src: Int32, n: Int32, krem: Int32, first_slot: Int32, s_hist: cute.Pointer,
                        s_key: cute.Pointer, s_idx: cute.Pointer, s_scan: cute.Pointer, s_misc: cute.Pointer,
                        out_row: cute.Pointer, s_tl: cute.Pointer):
        """CTA 0 alone: the krem largest of the n gathered items at src (largest key, then lowest index).

        Radix rounds over the keys' remaining bits, then over ~index (exact ties), each
        a histogram in this CTA only; the selected items go to slots from first_slot on.
        A bin of at most TIE_RANK_MAX items after a key round is ranked directly (take_ties), skipping the rounds
        left.
        """
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        kprefix = Uint32(0)
        kmask = Uint32(0)
        iprefix = Uint32(0)
        imask = Uint32(0)
        done = Int32(0)
        ranked = Int32(0)  # take_ties ran: it has output every selected item, and no selection pass follows
        rounds = self.gather_rounds
        # Both histogram buffers are zeroed here, behind one barrier; a buffer is zeroed again for
        # the round after next once its round's select has read it (the next round's barriers
        # order those stores before that round's atomics).
        for r in cutlass.range_constexpr(2):
            self.zero_bins(s_hist + r * self.bins, 1 << rounds[r][2])
        cute.arch.sync_threads()
        for r in cutlass.range_constexpr(len(rounds)):
            word, shift, bits = rounds[r]
            # Prefix tests that can fail in this round: the key's from the second round on, the
            # index's after the first index round (masks are still 0 before). Unneeded loads go too.
            key_test = r > 0
            idx_test = r > 0 and rounds[r - 1][0] == "idx"
            if done == 0:
                h = s_hist + (r % 2) * self.bins
                dmask = Uint32((1 << bits) - 1)
                for i in cutlass.range(tid, n, T, unroll=4):
                    key = cute.arch.load(s_key + src + i, Uint32)
                    v = key
                    if const_expr(word == "idx" or idx_test):
                        nidx = Uint32(cute.arch.load(s_idx + src + i, Int32)) ^ Uint32(0x1FFFFF)
                        if const_expr(word == "idx"):
                            v = nidx
                    bin_ptr = h + Int32((v >> Uint32(shift)) & dmask)
                    if const_expr(idx_test):
                        if (key & kmask == kprefix) & (nidx & imask == iprefix):
                            cute.arch.atomic_add(bin_ptr, Int32(1))
                    elif const_expr(key_test):
                        if key & kmask == kprefix:
                            cute.arch.atomic_add(bin_ptr, Int32(1))
                    else:
                        cute.arch.atomic_add(bin_ptr, Int32(1))
                if const_expr(self.finish_marks and r == 0):
                    cute.arch.sync_threads()
                    self.mark(s_tl, 13)
                b, above, count, _ = self.cluster_select(h, 1 << bits, krem, s_scan + (r % 2) * 32, s_misc,
                                                         local=True)
                if const_expr(self.finish_marks and r == 0):
                    self.mark(s_tl, 14)
                if const_expr(r + 2 < len(rounds)):
                    self.zero_bins(h, 1 << rounds[r + 2][2])
                krem = krem - above
                if const_expr(word == "key"):
                    kprefix = kprefix | (Uint32(b) << Uint32(shift))
                    kmask = kmask | (dmask << Uint32(shift))
                else:
                    iprefix = iprefix | (Uint32(b) << Uint32(shift))
                    imask = imask | (dmask << Uint32(shift))
                # Every item matching the prefix is needed: the rest of the bits change nothing.
                done = sel(krem == count, Int32(1), Int32(0))
                if const_expr(word == "key"):
                    # A bin of a few items (count of them from the prefix on, krem of which are taken): they are
                    # ranked directly instead of by the rounds left (each a histogram of up to 2**11 bins): by key,
                    # then lowest index; after the last key round they are exact ties of the resolved key (by index).
                    if (done == 0) & (count <= TIE_RANK_MAX):
                        self.take_ties(src, n, krem, count, kprefix, kmask, s_hist + ((r + 1) % 2) * self.bins,
                                       first_slot, s_key, s_idx, s_misc, out_row,
                                       by_key=rounds[r + 1][0] == "key")
                        done = Int32(1)
                        ranked = Int32(1)
                if const_expr(r < 2 and not (self.step1_marks or self.gather_marks or self.refine_marks
                                             or self.finish_marks)):
                    self.mark(s_tl, 13 + r)
            if const_expr(self.finish_marks and r == 0):
                self.mark(s_tl, 15)
        if const_expr(not (self.step1_marks or self.gather_marks or self.refine_marks or self.finish_marks)):
            self.mark(s_tl, 15)
        # Selected: above the prefix on the key bits, or equal there and not below it on ~index.
        if ranked == 0:
            if const_expr(self.ctas_per_sm > 1):
                for ib in cutlass.range(0, n, T, unroll=2):
                    i = ib + tid
                    key, idx = self.list_item(s_key + src, s_idx + src, i, n)
                    take = self.gathered_taken(key, Uint32(idx), i < n, kprefix, kmask, iprefix, imask)
                    slot = first_slot + self.warp_slot1(take, s_misc + 14)
                    if take:
                        cute.arch.store(out_row + slot, idx)
            else:
                self.select_gathered(src, n, first_slot, kprefix, kmask, iprefix, imask, s_key, s_idx, s_misc,
                                     out_row)

    @cute.jit
    def take_ties(self, src: Int32, n: Int32, krem: Int32, count: Int32, kprefix: Uint32, kmask: Uint32,
                  scratch: cute.Pointer, first_slot: Int32, s_key: cute.Pointer, s_idx: cute.Pointer,
                  s_misc: cute.Pointer, out_row: cute.Pointer, by_key: bool = False):
        """The gathered finish's last few candidates (count items whose key matches the resolved prefix; count <=
        TIE_RANK_MAX): packed into scratch (misc[13] counts), then each ranked by the number of them before it: a
        lower index among exact ties of the resolved key, or with by_key (the key's low bits still unresolved) a
        larger key, or the same key and a lower index; the krem first go to the output (slots from misc[14]). The
        packing pass also outputs every item above the prefix, the selection pass's work, which then does not run.
        Measured on the H200 (decode_topk_ab_h200.json): by key after the finish's first FP32 round, instead of a
        second round, 1-6 % faster on most FP32 cells (rank_after_first_round_ab); the selection pass folded in here,
        the short-row kernel 2-6 % faster and BF16 on 8 CTAs 1-3 %, the rest within about 1 % (ties_output_s20_ab)."""
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        lane = cute.arch.lane_idx()
        idx_at = TIE_RANK_MAX if by_key else 0  # (the keys, by_key, first)
        for ib in cutlass.range(0, n, T, unroll=2):
            i = ib + tid
            key, idx = self.list_item(s_key + src, s_idx + src, i, n)
            tie = (i < n) & ((key & kmask) == kprefix)
            above = (i < n) & ((key & kmask) > kprefix)
            slot = self.warp_slot1(tie, s_misc + 13)
            out_slot = first_slot + self.warp_slot1(above, s_misc + 14)
            if tie:
                cute.arch.store(scratch + idx_at + slot, idx)
                if const_expr(by_key):
                    cute.arch.store(scratch + slot, key)
            if above:
                cute.arch.store(out_row + out_slot, idx)
        cute.arch.sync_threads()
        mine_key = Uint32(0)
        mine = Int32(0)
        rank = Int32(0)
        if tid - lane < count:  # warps holding a candidate (the rest skip the loop)
            if tid < count:
                mine = cute.arch.load(scratch + idx_at + tid, Int32)
                if const_expr(by_key):
                    mine_key = cute.arch.load(scratch + tid, Uint32)
            for j in cutlass.range(0, count, 4):
                v0, v1, v2, v3 = ptx.ld_shared_v4_u32(smem_addr(scratch + idx_at + j))
                if const_expr(by_key):
                    k0, k1, k2, k3 = ptx.ld_shared_v4_u32(smem_addr(scratch + j))
                    for q, (kq, v) in enumerate(((k0, v0), (k1, v1), (k2, v2), (k3, v3))):
                        before = (kq > mine_key) | ((kq == mine_key) & (Int32(v) < mine))
                        rank = rank + sel(before & (j + q < count), Int32(1), Int32(0))
                else:
                    for q, v in enumerate((v0, v1, v2, v3)):
                        rank = rank + sel((Int32(v) < mine) & (j + q < count), Int32(1), Int32(0))
        take = (tid < count) & (rank < krem)
        slot = first_slot + self.warp_slot1(take, s_misc + 14)
        if take:
            cute.arch.store(out_row + slot, mine)

    @cute.jit
    def select_gathered(self, src: Int32, n: Int32, first_slot: Int32, kprefix: Uint32, kmask: Uint32,
                        iprefix: Uint32, imask: Uint32, s_key: cute.Pointer, s_idx: cute.Pointer,
                        s_misc: cute.Pointer, out_row: cute.Pointer):
        """The gathered finish's selection pass by SELECT_VEC items a thread per iteration, one slot
        reservation a warp for all of them (a long row gathers ~10 items a thread: one chain of load,
        ballot, add and store each took ~3K cycles)."""
        T = self.threads
        tid = cute.arch.thread_idx()[0]
        V = SELECT_VEC
        lt = cute.arch.lanemask_lt()
        keys = cute.make_rmem_tensor(V, Uint32)
        idxs = cute.make_rmem_tensor(V, Uint32)
        for ib in cutlass.range(0, n, T * V):
            n_take = Int32(0)
            for j in cutlass.range_constexpr(V):
                i = ib + j * T + tid
                key, idx = self.list_item(s_key + src, s_idx + src, i, n)
                keys[j] = key
                idxs[j] = Uint32(idx)
                take = self.gathered_taken(key, Uint32(idx), i < n, kprefix, kmask, iprefix, imask)
                n_take = n_take + Int32(cute.arch.popc(cute.arch.vote_ballot_sync(take)))
            slot = first_slot + self.warp_atomic_base(n_take, s_misc + 14)
            for j in cutlass.range_constexpr(V):
                take = self.gathered_taken(keys[j], idxs[j], ib + j * T + tid < n, kprefix, kmask, iprefix, imask)
                m = cute.arch.vote_ballot_sync(take)
                if take:
                    cute.arch.store(out_row + slot + Int32(cute.arch.popc(m & lt)), Int32(idxs[j]))
                slot = slot + Int32(cute.arch.popc(m))

    @cute.jit
    def zero_bins(self, h: cute.Pointer, nbins: int):
        """Zero the first nbins (a multiple of 4) of a histogram, 16 bytes a store."""
        tid = cute.arch.thread_idx()[0]
        for i in cutlass.range_constexpr(0, nbins, self.threads * 4):
            if const_expr(i + self.threads * 4 <= nbins):
                ptx.st_shared_v4_b32(smem_addr(h + i + tid * 4), 0, 0, 0, 0)
            else:
                if i + tid * 4 < nbins:
                    ptx.st_shared_v4_b32(smem_addr(h + i + tid * 4), 0, 0, 0, 0)

    @cute.jit
    def gathered_taken(self, key: Uint32, idx: Uint32, valid, kprefix: Uint32, kmask: Uint32, iprefix: Uint32,
                       imask: Uint32):
        """Selected by the gathered finish: above the prefix on the key bits, or equal there and not
        below it on ~index."""
        nidx = idx ^ Uint32(0x1FFFFF)
        kk = key & kmask
        return valid & ((kk > kprefix) | ((kk == kprefix) & (nidx & imask >= iprefix)))

    # ------------------------------------------------------------------ the kernel
    @cute.jit
    def wait_for_inputs(self):
        """Programmatic dependent launch: the setup above (shared-memory zeroing) overlaps the
        previous grid; every global access (row ends, logits, the output rows, which that grid may
        still read or write) comes after the wait."""
        cute.arch.griddepcontrol_wait()

    @cute.jit
    def let_next_grid_start(self):
        """After step 1: the next grid may be scheduled (it waits in turn for this one to finish;
        this grid's CTAs are all resident, one wave, so it only takes SMs left free). Measured on
        the H200 against a trigger right after the wait (decode_topk_ab_h200.json: pdl_ab): 0.5 %
        faster over 264 cases, 0.1-0.2 us on long rows; a CTA that skips step 1 triggers at exit."""
        cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def prefetch_first_tile(self, logits: cute.Pointer, row: Int32, rank: Int32, width: Int32, stride: Int32):
        """Thread 0, before the row's end is read: an L2 prefetch of the first EARLY_PREFETCH_TILES tiles of this CTA's
        slice of a row that ends at width, if that slice has at least EARLY_PREFETCH_MIN_TILES tiles."""
        T = self.threads
        n_groups = (width + 7) // 8
        per = self.slice_groups(n_groups)
        if per >= EARLY_PREFETCH_MIN_TILES * T:
            row_addr = self.row_address(logits, row, stride)
            g0 = rank * per
            g1 = g0 + EARLY_PREFETCH_TILES * T
            self.prefetch_groups(row_addr, g0, Int32(sel(g1 < n_groups, g1, n_groups)), width)

    @cute.jit
    def row_span(self, logits: cute.Pointer, row_ends: cute.Pointer, out: cute.Pointer, row: Int32, width: Int32,
                 stride: Int32, out_stride: Int32):
        """Row `row`'s end clipped to [0, width], its 8-column groups and items (columns, or blocks),
        its output row and the address of its logits."""
        row_end = cute.arch.load(row_ends + row, Int32)
        row_end = sel(row_end < 0, Int32(0), row_end)
        row_end = Int32(sel(row_end > width, width, row_end))
        n_groups = (row_end + 7) // 8
        n_items = row_end
        if const_expr(self.block_mode):
            n_items = n_groups
        out_row = out + row * out_stride
        return row_end, n_groups, n_items, out_row, self.row_address(logits, row, stride)

    def row_address(self, logits: cute.Pointer, row: Int32, stride: Int32) -> Int64:
        """The global address of row `row`'s logits (traced inline)."""
        return logits.toint() + Int64(row) * Int64(stride) * self.elem_bytes

    def slice_groups(self, n_groups: Int32) -> Int32:
        """Groups of a row's slice on each CTA of the cluster but the last (traced inline)."""
        return (n_groups + self.cluster - 1) // self.cluster

    @cute.kernel
    def kernel(self, logits: cute.Pointer, row_ends: cute.Pointer, out: cute.Pointer, width: Int32, stride: Int32,
               out_stride: Int32, k: Int32):
        T = self.threads
        C = self.cluster
        tid = cute.arch.thread_idx()[0]
        bid = cute.arch.block_idx()[0]
        rank = Int32(0)
        if const_expr(C > 1):
            rank = cute.arch.block_idx_in_cluster()
        row = bid // C

        s = self.allocate_smem()
        s_hist, s_scan, s_misc, s_warp = s["hist"], s["scan"], s["misc"], s["warp"]
        s_peer, s_key, s_idx = s["peer"], s["key"], s["idx"]
        s_tl = s.get("marks", s_misc)
        s_table = s.get("table", s_misc)  # (s_misc: a placeholder where there is no table, never used)
        s_win = s.get("window", s_misc)
        self.mark(s_tl, 0)
        rkeys = cute.make_rmem_tensor(8, Uint32)
        rraw = cute.make_rmem_tensor(8, Uint32)
        rnext = cute.make_rmem_tensor(8, Uint32)
        rnext2 = cute.make_rmem_tensor(8, Uint32)
        for j in cutlass.range_constexpr(8):
            rraw[j] = Uint32(0)
            rnext[j] = Uint32(0)
            rnext2[j] = Uint32(0)
        # One CTA an SM (128 registers): a short slice's first two tiles stay in registers for the gather.
        keep_two = self.ctas_per_sm == 1
        rkeep = cute.make_rmem_tensor(8, Uint32)
        for j in cutlass.range_constexpr(8):
            rkeep[j] = Uint32(0)

        # misc: 0 bin, 1 above, 2 row's > threshold slots handed out (CTA 0's), 3 local == counter,
        # 4 == items of lower ranks, 5 local k-th bin (then the first digit's window total: select_bins), 6 bin count,
        # 7 local above, 8 gt base, 9 local > counter,
        # 10 the gather pass's in-bin counter, 11 local highest nonempty bin,
        # 12 step 1's shared bound (warp loop), 13 the gathered finish's tie counter (take_ties),
        # 14 the gathered finish's slot counter; finish_low_bits: 10 and 15 its slot counters
        # Zeroed first, on every path (the short-row path does not read them): a use of row_end
        # placed before these stores would make them wait for its load. Step 1's barrier, after
        # its first loads are issued, orders them before any use.
        self.zero_bins(s_hist, 2 * self.bins)
        if tid < 16:
            cute.arch.store(s_misc + tid, Int32(0))
        if const_expr(C > 1):
            if tid == 0:
                if const_expr(self.async_pushes):
                    # CTA 0's is the one used: one arrival a CTA (its pushed bytes).
                    ptx.mbarrier_init(smem_addr(s["bar"]), C)
                # The peers' words of the first digit (peer_words_bar): their bytes, behind this one arrival.
                words_bar = self.peer_words_bar(s_misc)
                ptx.mbarrier_init(words_bar, 1)
                ptx.mbarrier_arrive_expect_tx(words_bar, self.peer_word_bytes())
                # Published by the cluster barrier of step 1's start (its wait precedes any CTA's st.async).
                ptx.fence_mbarrier_init_cluster()
        if const_expr(self.refine_window):
            if tid < REFINE_WINDOW_BINS * 32:
                cute.arch.store(s_win + tid, Int32(0))
        self.wait_for_inputs()
        if const_expr(self.bulk_stages > 0 and C <= EARLY_PREFETCH_MAX_CLUSTER):
            if tid == 0:
                self.prefetch_first_tile(logits, row, rank, width, stride)
        row_end, n_groups, n_items, out_row, row_addr = self.row_span(logits, row_ends, out, row, width, stride,
                                                                      out_stride)

        if n_items <= k:
            self.mark(s_tl, 1)
            # Every candidate is selected: index order, then -1. No cluster barrier on
            # this path (the whole cluster takes it, as n_items is per row).
            for j in cutlass.range(rank * T + tid, k, C * T):
                cute.arch.store(out_row + j, sel(j < n_items, j, Int32(-1)))
        else:
            self.mark(s_tl, 1)
            per = self.slice_groups(n_groups)
            g_lo = Int32(sel(rank * per < n_groups, rank * per, n_groups))
            g_hi = Int32(sel(g_lo + per < n_groups, g_lo + per, n_groups))

            # Step 1: one read of the slice: the first digit's histogram, and the list of
            # the items that can still be selected, in index order. An item whose digit is
            # below the bin of the CTA's own k-th largest so far (`bound`) is below the
            # row's k-th largest too; the bound is refreshed, and the list filtered with
            # it, only when the list cannot take another tile.
            shift0 = self.key_bits - self.digits[0]
            n_list = Int32(0)
            ok = Int32(1)
            sp = Int32(0)
            if const_expr(C > 1):
                # Every CTA of the cluster has started before any stores into its shared memory
                # (the pushes after step 1 wait on this phase).
                cute.arch.cluster_arrive_relaxed()
            short = self.step1_by_tiles(g_hi - g_lo)
            window = Int32(-1)  # refine_window's first bin (no table: -1)
            if short:
                # (the same on every CTA: per is the first CTA's slice)
                windowed = (cute.arch.grid_dim()[0] >= REFINE_WINDOW_MIN_CTAS) & (
                    per >= REFINE_WINDOW_MIN_TILES * T) & (k >= 256 * C)
                window = self.step1_tiles(row_addr, g_lo, g_hi, row_end, s_hist, rraw, rnext, rnext2, rkeys, s_tl,
                                          smem_addr(s_table), smem_addr(s_key), k, s_scan, s_misc, s_win, windowed,
                                          rkeep if keep_two else None)
                ok = Int32(0)
            else:
                n_list, ok = self.step1_warp(row_addr, g_lo, g_hi, row_end, k, s_hist, s_key, s_idx, s_warp, s_scan,
                                             s_misc, rraw, rnext, rnext2, rkeys)
                sp = Int32(1)
            # This CTA's list length: cap + 1 if it overflowed (no room behind it), 0 for a short slice (no list,
            # all of CTA 0's room for the gathered finish). Without a list, the later steps re-read the slice.
            list_len = Int32(sel(ok != 0, n_list, Int32(self.cap + 1)))
            list_len = Int32(sel(short, Int32(0), list_len))
            self.mark(s_tl, 2)
            self.let_next_grid_start()
            # Step 2: the cluster's first digit. Each CTA's own k-th largest bin is a floor
            # for the row's, so the peers' bins below the highest floor are not read.
            # (The warp loop has found it already.) The floors, and CTA 0's list length (the
            # threshold bin's items of the cluster gather behind it), go into every CTA's
            # s_peer before the select's barrier: they are read locally, with no round trip.
            gather_base = list_len
            if const_expr(C > 1):
                if const_expr(C >= SHORT_FLOORS_MIN_CLUSTER):
                    if short:
                        cute.arch.sync_threads()
                        self.local_top_bin(s_hist, s_misc)  # -> misc[11] (its floor, misc[5], stays 0)
                cute.arch.cluster_wait()
                self.mark(s_tl, 3)
                if tid < C:
                    # To CTA tid, by st.async onto its peer_words_bar (peer_word_bytes in all).
                    words_bar = ptx.mapa_shared(self.peer_words_bar(s_misc), tid)
                    self.push_peer_word(s_peer + rank, cute.arch.load(s_misc + 5, Int32), tid, words_bar)
                    top = cute.arch.load(s_misc + 11, Int32)
                    if const_expr(C < SHORT_FLOORS_MIN_CLUSTER):
                        top = sel(short, Int32((1 << self.digits[0]) - 1), top)  # its floor: misc[5], still 0
                    self.push_peer_word(s_peer + 32 + rank, top, tid, words_bar)
                    if rank == 0:
                        self.push_peer_word(s_peer + 16, list_len, tid, words_bar)
                    if const_expr(self.refine_window):
                        self.push_peer_word(s_peer + 24 + rank, window, tid, words_bar)
            b0, above0, count0, gt_mine = self.cluster_select(s_hist, 1 << self.digits[0], k, s_scan + sp * 32,
                                                              s_misc, floors=s_peer)
            krem = k - above0
            use_list = ok != 0
            self.mark(s_tl, 4)
            if const_expr(C > 1):
                gather_base = cute.arch.load(s_peer + 16, Int32)
            # Once the k-th item is the last of its bin, every item of the bin is selected and
            # the remaining digits change nothing (the cluster-wide finish stops at once). Else,
            # if CTA 0 has room, the bin's items are gathered there and it finishes alone
            # (block-local rounds instead of cluster-wide ones). The same choice on every CTA.
            gather = (krem != count0) & (gather_base + count0 <= self.cap)
            if const_expr(self.force_clustered):
                gather = False
            if gather:
                low_bits = False
                if const_expr(self.low_bits_finish):
                    # Every CTA ran step 1 by tiles (the first CTA's slice is the largest) and stages its items of
                    # the bin (the largest CTA count of it came with the select): the same choice on every CTA.
                    low_bits = self.step1_by_tiles(per) & (
                        cute.arch.load(s_peer + 17, Int32) <= GATHER_STAGE)
                if low_bits:
                    self.finish_low_bits(row_addr, g_lo, g_hi, row_end, k, krem, Uint32(b0), gt_mine, rank, s_hist,
                                         s_key, s_idx, s_scan, s_misc, s_peer, s_table, s_tl, out_row, rraw, rkeys,
                                         rkeep, rnext)
                else:
                    # The lower ranks' in-bin count came with the select (misc[4]).
                    dst_base = gather_base + cute.arch.load(s_misc + 4, Int32)
                    slot0 = Int32(0)
                    refine = False
                    own_stage = self.cap - count0  # (refine: where this CTA stages its items, in its own list)
                    if const_expr(self.refine_floor):
                        # Every CTA ran step 1 by tiles (no list), the first (the largest slice) with a table, and
                        # CTA 0's list holds the bin and a stage as large behind it: the same choice on every CTA.
                        # Only where the CTAs re-read many groups (the items from the bin up, a CTA's share): there
                        # the re-read and the finish shrink more than the table's second pass and the barrier cost.
                        refine = self.step1_by_tiles(per) & (per > 2 * T) & (gather_base + 2 * count0 <= self.cap) & (
                            above0 + count0 >= REFINE_MIN_ITEMS_A_CTA * C) & (count0 >= REFINE_MIN_BIN_RATIO * krem)
                    if use_list:
                        if const_expr(C >= GATHER_STAGE_MIN_CLUSTER):
                            slot0 = self.push_list_staged(n_list, b0, dst_base, gt_mine, s_hist, s_key, s_idx, s_misc,
                                                          out_row, rkeys, rraw)
                        else:
                            n_above = self.gather_list(n_list, Uint32(b0), dst_base, s_key, s_idx, s_misc, out_row,
                                                       rkeys, rraw, pushes=True, slot0=Int32(0))
                            # The warp's output slots: one add on the row's counter in CTA 0 (before this
                            # CTA arrives at the barrier below, after which CTA 0 may finish and exit).
                            slot0 = self.warp_atomic_base(n_above, s_misc + 2, in_cta0=True)
                        self.mark(s_tl, 12)
                    else:
                        gt_base = self.slot_bases(rank, s_hist + b0, gt_mine, s_misc, eq_known=True)[1]
                        self.mark(s_tl, 12)  # (without a list: the slot reservation comes before the pass)
                        # The bin's items go to CTA 0's list from slot dst_base on, or, on clusters of at least
                        # STAGE_NO_LIST_MIN_CLUSTER CTAs, to this CTA's stage where they fit (then copied densely).
                        list_base = smem_addr(s_key + dst_base)
                        idx_delta = smem_addr(s_idx) - smem_addr(s_key)
                        lo = self.bin_bounds(b0)[0]
                        staged = None
                        if const_expr(C >= STAGE_NO_LIST_MIN_CLUSTER):
                            stage, staged = self.push_stage(s_hist, b0)
                            list_base = sel(staged, smem_addr(stage), list_base)
                            idx_delta = sel(staged, Int32(GATHER_STAGE * 4), idx_delta)
                        if const_expr(self.refine_floor):
                            if refine:
                                lo = self.refined_floor(Uint32(b0), krem, g_hi - g_lo > 2 * T, smem_addr(s_table),
                                                        (g_hi - g_lo + T - 1) // T, s_hist + 2 * self.bins - 32,
                                                        s_tl, s_peer, s_win)
                            # The items from lo on are staged at the end of this CTA's own list (the slots of the
                            # bin's count before it: none that CTA 0's list takes), then copied densely behind a
                            # reservation on CTA 0's counter (misc[15]), as many as there are.
                            list_base = sel(refine, smem_addr(s_key + own_stage), list_base)
                            idx_delta = sel(refine, smem_addr(s_idx) - smem_addr(s_key), idx_delta)
                            staged = refine if const_expr(staged is None) else refine | staged
                        self.gather_no_list(row_addr, g_lo, g_hi, row_end, lo, gt_base, list_base, idx_delta,
                                            staged, s_misc, out_row, rraw, rkeys, rkeep, rnext, s_table, s_tl, short)
                        if const_expr(staged is not None):
                            if staged:
                                cute.arch.sync_threads()  # every warp's stage stores and its in-bin count (misc[3])
                                n_staged = cute.arch.load(s_misc + 3, Int32)
                                if refine:
                                    if tid == 0:
                                        at = ptx.mapa_shared(smem_addr(s_misc + 15), Int32(0))
                                        cute.arch.store(s_misc + 12, Int32(ptx.atom_add_cluster_u32(at, n_staged)))
                                    cute.arch.sync_threads()
                                    self.push_staged(s_key + own_stage, s_idx + own_stage, n_staged, s_key, s_idx,
                                                     gather_base + cute.arch.load(s_misc + 12, Int32), s_misc)
                                else:
                                    if const_expr(C >= STAGE_NO_LIST_MIN_CLUSTER):
                                        self.push_staged(stage, stage + GATHER_STAGE, n_staged, s_key, s_idx, dst_base,
                                                         s_misc)
                    self.mark(s_tl, 5)
                    # The pushes to CTA 0 are complete (release/acquire, or on large clusters CTA 0's push mbarrier),
                    # and no CTA reads a peer's shared memory after this barrier: the peers may exit. The output
                    # writes of a listed CTA go between the arrive and the wait: the arrive's release does not wait
                    # for them, and they hide the barrier's latency.
                    # (One CTA: the same two passes; fewer registers live than one pass doing both.)
                    if const_expr(self.async_pushes):
                        # This CTA's pushes (every in-bin item the pass counted: misc[10] with a list, else misc[3])
                        # went by st.async: one relaxed arrival on CTA 0's push mbarrier says how many bytes to wait
                        # for. The barrier is relaxed but where CTA 0 reads the peers' reservations next (refine).
                        cute.arch.sync_threads()  # every warp's pushes issued, its counts added
                        if tid == 0:
                            n_pushed = sel(use_list, cute.arch.load(s_misc + 10, Int32),
                                           cute.arch.load(s_misc + 3, Int32))
                            ptx.mbarrier_arrive_expect_tx_cluster(self.push_bar(s_misc), n_pushed * 8)
                        if refine:
                            cute.arch.cluster_arrive()
                        else:
                            cute.arch.cluster_arrive_relaxed()
                    elif const_expr(C > 1):
                        cute.arch.cluster_arrive()
                    if use_list:
                        self.gather_list(n_list, Uint32(b0), dst_base, s_key, s_idx, s_misc, out_row,
                                         rkeys, rraw, pushes=False, slot0=slot0)
                    if const_expr(C > 1):
                        cute.arch.cluster_wait()
                        if const_expr(self.async_pushes):
                            if rank == 0:
                                # CTA scope suffices (the bytes land in this CTA's memory, counted by its mbarrier),
                                # and keeps the L1 (a cluster-scope acquire invalidates it).
                                ptx.mbarrier_wait_parity(smem_addr(s["bar"]), 0, cluster=False)
                    else:
                        cute.arch.sync_threads()
                    self.mark(s_tl, 6)
                    if rank == 0:
                        n_gathered = count0
                        if const_expr(self.refine_floor):
                            if refine:
                                n_gathered = cute.arch.load(s_misc + 15, Int32)
                        self.finish_gathered(gather_base, n_gathered, krem, k - krem, s_hist, s_key, s_idx, s_scan,
                                             s_misc, out_row, s_tl)
                    self.mark(s_tl, 7)
            else:
                self.mark(s_tl, 8)  # the cluster-wide finish instead (no 5-7)
                self.finish_clustered(use_list, n_list, row_addr, g_lo, g_hi, row_end, k, rank, b0, krem, count0,
                                      gt_mine, s_hist, s_key, s_idx, s_scan, s_misc, out_row, rraw, rkeys)
        if const_expr(self.timeline):
            cute.arch.sync_threads()
            self.mark(s_tl, 9)
            # Over this CTA's 64 bytes of the row's logits from byte 64 * rank (read by no CTA any more).
            self.store_marks(s_tl, row_addr + Int64(rank) * 64)

    @cute.jit
    def store_marks(self, s_tl: cute.Pointer, dst: Int64):
        """Timing experiment: thread 0 stores marks 0-9 and 12-15 (0 where a path has none) and the global
        timer at the start (11) and now (10) as 64 bytes at dst."""
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.store(s_tl + 10, ptx.globaltimer_lo())
            for q in cutlass.range_constexpr(4):
                ptx.st_global_v4_b32(dst + 16 * q, *[cute.arch.load(s_tl + 4 * q + j, Int32) for j in range(4)])

    @cute.jit
    def mark(self, s_tl: cute.Pointer, i: int):
        """Timing experiment: thread 0's SM clock as mark i (mark 0 also zeroes the others and keeps the
        global timer in slot 11). Nothing without the timeline switch (or stop_at: the CTA's end there)."""
        if const_expr(self.stop_at == i):
            # (Marks 13-15 of CTA 0's finish: its peers are gone, a CTA barrier only.)
            finish_mark = i >= 13 and not (self.step1_marks or self.gather_marks or self.refine_marks)
            if const_expr(self.cluster > 1 and not finish_mark):
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
            else:
                cute.arch.sync_threads()
            ptx.exit_thread()
        if const_expr(self.timeline):
            if cute.arch.thread_idx()[0] == 0:
                if const_expr(i == 0):
                    for j in cutlass.range_constexpr(16):
                        cute.arch.store(s_tl + j, Int32(0))
                    cute.arch.store(s_tl + 11, ptx.globaltimer_lo())
                cute.arch.store(s_tl + i, ptx.clock32())

    @cute.jit
    def step1_mark(self, s_tl: cute.Pointer, i: int, first_tile):
        """Timing experiment timeline_step1: mark i inside step 1's first CTA tile. Nothing otherwise."""
        if const_expr(self.step1_marks):
            if first_tile:
                self.mark(s_tl, i)

    @cute.jit
    def finish_clustered(self, use_list, n_list: Int32, row_addr: Int64, g_lo: Int32, g_hi: Int32, row_end: Int32,
                         k: Int32, rank: Int32, b0: Int32, krem: Int32, count0: Int32, gt_mine: Int32,
                         s_hist: cute.Pointer, s_key: cute.Pointer, s_idx: cute.Pointer, s_scan: cute.Pointer,
                         s_misc: cute.Pointer, out_row: cute.Pointer, rraw: cute.Tensor, rkeys: cute.Tensor):
        """The remaining digits by cluster-wide rounds (over the list, or the slice if it did not fit), then the
        writes."""
        T = self.threads
        C = self.cluster
        tid = cute.arch.thread_idx()[0]
        shift0 = self.key_bits - self.digits[0]
        prefix = Uint32(b0) << Uint32(shift0)
        mask = Uint32(((1 << self.digits[0]) - 1) << shift0)
        done = sel(krem == count0, Int32(1), Int32(0))
        eq_off = b0  # histogram word counting this CTA's items equal to the prefix
        cute.arch.sync_threads()
        for d in cutlass.range_constexpr(1, len(self.digits)):
            if done == 0:
                hist_par = d % 2
                h = s_hist + hist_par * self.bins
                shift = self.key_bits - sum(self.digits[: d + 1])
                dmask = Uint32((1 << self.digits[d]) - 1)
                # This buffer was last read by the peers before they arrived at the
                # previous cluster barrier, which this CTA has passed: safe to clear.
                for i in cutlass.range(tid, 1 << self.digits[d], T):
                    cute.arch.store(h + i, Int32(0))
                cute.arch.sync_threads()
                if use_list:
                    for i in cutlass.range(tid, n_list, T):
                        key = cute.arch.load(s_key + i, Uint32)
                        if key & mask == prefix:
                            cute.arch.atomic_add(h + Int32((key >> Uint32(shift)) & dmask), Int32(1))
                else:
                    for gb in cutlass.range(g_lo, g_hi, T):
                        self.load_items(row_addr, gb + tid, g_hi, row_end, rraw, rkeys)
                        for j in cutlass.range_constexpr(self.items):
                            key = rkeys[j]
                            if key & mask == prefix:
                                cute.arch.atomic_add(h + Int32((key >> Uint32(shift)) & dmask), Int32(1))
                bd, aboved, countd, gt_mined = self.cluster_select(h, 1 << self.digits[d], krem,
                                                                   s_scan + (d % 2) * 32, s_misc)
                krem = krem - aboved
                prefix = prefix | (Uint32(bd) << Uint32(shift))
                mask = mask | (dmask << Uint32(shift))
                done = sel(krem == countd, Int32(1), Int32(0))
                gt_mine = gt_mine + gt_mined
                eq_off = hist_par * self.bins + bd

        # Step 3: write. Items with (key & mask) > prefix are selected; `krem` of those
        # equal to it are still needed (exact ties unless all of them are taken).
        need_eq = krem
        gt_total = k - need_eq
        eq_local = cute.arch.load(s_hist + eq_off, Int32)
        eq_before, gt_base = self.slot_bases(rank, s_hist + eq_off, gt_mine, s_misc)
        take = need_eq - eq_before
        take = sel(take < 0, Int32(0), take)
        take = Int32(sel(take > eq_local, eq_local, take))
        ordered = take < eq_local
        eq_base = gt_total + eq_before
        slot_counter = s_misc + 9  # this CTA's > threshold items so far
        local_counter = s_misc + 3  # this CTA's == threshold items so far (when all are taken)
        if use_list:
            par = Int32(0)
            base = Int32(0)
            for ib in cutlass.range(0, n_list, T):
                i = ib + tid
                key, idx = self.list_item(s_key, s_idx, i, n_list)
                slot = gt_base + self.warp_slot1(key & mask > prefix, slot_counter)
                if key & mask > prefix:
                    cute.arch.store(out_row + slot, idx)
                eq = (i < n_list) & (key & mask == prefix)
                if ordered:
                    incl, tot = self.block_scan(sel(eq, Int32(1), Int32(0)), s_scan + par * 32, bits=1)
                    r = base + incl - 1
                    if eq:
                        if r < take:
                            cute.arch.store(out_row + eq_base + r, idx)
                    base = base + tot
                    par = 1 - par
                else:
                    r = eq_base + self.warp_slot1(eq, local_counter)
                    if eq:
                        cute.arch.store(out_row + r, idx)
        else:
            par = Int32(0)
            base = Int32(0)
            for gb in cutlass.range(g_lo, g_hi, T):
                g = gb + tid
                self.load_items(row_addr, g, g_hi, row_end, rraw, rkeys)
                gt, eq = self.count_vs_threshold(rkeys, mask, prefix)
                slot = gt_base + self.warp_slots(gt, slot_counter)
                for j in cutlass.range_constexpr(self.items):
                    if rkeys[j] & mask > prefix:
                        cute.arch.store(out_row + slot, self.item_index(g, j))
                        slot = slot + 1
                if ordered:
                    incl, tot = self.block_scan(eq, s_scan + par * 32, bits=count_bits(self.items))
                    r = base + incl - eq
                    for j in cutlass.range_constexpr(self.items):
                        if rkeys[j] & mask == prefix:
                            if r < take:
                                cute.arch.store(out_row + eq_base + r, self.item_index(g, j))
                            r = r + 1
                    base = base + tot
                    par = 1 - par
                else:
                    for j in cutlass.range_constexpr(self.items):
                        if rkeys[j] & mask == prefix:
                            r = cute.arch.atomic_add(local_counter, Int32(1))
                            cute.arch.store(out_row + eq_base + r, self.item_index(g, j))
        # No CTA may exit while a peer can still read its histograms or add to CTA 0's
        # counter. Those accesses have returned their values before the peer arrives, and
        # nothing is published here, so a relaxed arrive (no wait for this CTA's stores).
        if const_expr(C > 1):
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()


class DecodeTopKRow(DecodeTopK):
    """One CTA a row, the row read once into registers: the short-row variant (contract: ROW_MAX_WIDTH).

    A row of up to threads * groups * 8 columns is loaded at once (group g = tid + i * threads:
    each warp load covers contiguous bytes) and kept in registers as keys. The first digit's
    histogram and select run on them; the items above its bin go straight to the output, the
    bin's items to a shared-memory list, and the gathered finish (the cluster kernel's, on this
    CTA alone) resolves the bin. No cluster barrier, no DSMEM, no re-read of the row.
    """

    def __init__(self, dtype: str, block_mode: bool, threads: int, hist_bins: int, groups_per_thread: int,
                 list_capacity: int, smem_bytes: int):
        super().__init__(dtype, block_mode, cluster=1, threads=threads, hist_bins=hist_bins, list_capacity=0,
                         smem_bytes=smem_bytes, warp_min_groups=0, ctas_per_sm=1)
        # The timing experiment's marks (DECODE_TOPK_EXPERIMENT=timeline) get their own array here; the
        # step-1 split (timeline_step1) does not apply.
        self.step1_marks = False
        self.groups = groups_per_thread
        # The first digit's bin may hold the whole row (all equal): the list holds every item.
        self.cap = list_capacity
        assert self.cap >= threads * groups_per_thread * self.items
        if self.timeline:
            # The marks take 16 words of the list (a timing build: never in a committed cache; run it on rows
            # whose first digit's bin holds fewer items than that, e.g. random or indexer logits).
            self.cap -= 16

    def smem_arrays(self):
        arrays = [("hist", 2 * self.bins), ("scan", 2 * 32), ("misc", 16), ("key", self.cap), ("idx", self.cap)]
        if self.timeline:
            arrays.append(("marks", 16))
        return arrays

    @cute.kernel
    def kernel(self, logits: cute.Pointer, row_ends: cute.Pointer, out: cute.Pointer, width: Int32, stride: Int32,
               out_stride: Int32, k: Int32):
        T = self.threads
        G = self.groups
        tid = cute.arch.thread_idx()[0]
        row = cute.arch.block_idx()[0]
        s = self.allocate_smem()
        s_hist, s_scan, s_misc, s_key, s_idx = s["hist"], s["scan"], s["misc"], s["key"], s["idx"]
        s_tl = s.get("marks", s_misc)
        self.mark(s_tl, 0)
        # misc: 0 bin, 1 above, 6 bin count, 7 (unused), 3 the list's counter, 9 the > bin slots' counter,
        # 13 the gathered finish's tie counter (take_ties), 14 its slot counter.
        self.zero_bins(s_hist, self.bins)
        if tid < 16:
            cute.arch.store(s_misc + tid, Int32(0))
        self.wait_for_inputs()
        row_end, n_groups, n_items, out_row, row_addr = self.row_span(logits, row_ends, out, row, width, stride,
                                                                      out_stride)
        if n_items <= k:
            for j in cutlass.range(tid, k, T):
                cute.arch.store(out_row + j, sel(j < n_items, j, Int32(-1)))
        else:
            self.mark(s_tl, 1)
            raws = [cute.make_rmem_tensor(8, Uint32) for _ in range(G)]
            keys = [cute.make_rmem_tensor(8, Uint32) for _ in range(G)]
            for i in cutlass.range_constexpr(G):
                for j in cutlass.range_constexpr(8):
                    raws[i][j] = Uint32(0)
                self.load_raw(row_addr, tid + i * T, n_groups, row_end, raws[i])
            cute.arch.sync_threads()  # the zeroed bins and counters before any atomic
            shift0 = Uint32(self.key_bits - self.digits[0])
            # Every per-item pass skips the groups past the row (a short row leaves most of them empty):
            # the passes are issue-bound, a few instructions an item.
            for i in cutlass.range_constexpr(G):
                if tid + i * T < n_groups:
                    self.raw_to_items(raws[i], tid + i * T, n_groups, row_end, keys[i])
                    # A missing column of the partial last group has key 0 (bin 0: never the k-th's bin).
                    for j in cutlass.range_constexpr(self.items):
                        cute.arch.atomic_add(s_hist + Int32(keys[i][j] >> shift0), Int32(1))
            self.mark(s_tl, 2)
            self.let_next_grid_start()
            b0, above, count, _ = self.cluster_select(s_hist, self.bins, k, s_scan, s_misc, local=True)
            self.mark(s_tl, 4)
            # Items above the bin: the first `above` slots; the bin's items: the list, for the finish.
            lo, hi = self.bin_bounds(b0)
            gt = Int32(0)
            eq = Int32(0)
            for i in cutlass.range_constexpr(G):
                if tid + i * T < n_groups:
                    gt_i, eq_i = self.count_in_bin(keys[i], lo, hi)
                    gt = gt + gt_i
                    eq = eq + eq_i
            slot, e = self.warp_slots2(gt, eq, s_misc + 9, s_misc + 3)
            out_addr = out_row.toint() + Int64(slot) * 4
            list_addr = smem_addr(s_key + e)
            idx_delta = smem_addr(s_idx) - smem_addr(s_key)
            for i in cutlass.range_constexpr(G):
                if tid + i * T < n_groups:
                    out_addr, list_addr = self.split_group(keys[i], tid + i * T, lo, hi, out_addr, list_addr,
                                                           idx_delta)
            self.mark(s_tl, 5)
            self.mark(s_tl, 6)
            # The finish's first barrier orders the list's stores before its reads.
            self.finish_gathered(Int32(0), count, k - above, above, s_hist, s_key, s_idx, s_scan, s_misc, out_row,
                                 s_tl)
            self.mark(s_tl, 7)
        if const_expr(self.timeline):
            # The cluster kernel's layout of marks (gpu/jobs/topk_timeline.py): 0 start, 1 row read, 2 loads and
            # histogram, 4 first digit, 5 = 6 pass over the items, 13-15 and 7 the finish, 9 end; over the
            # row's first 64 bytes of logits.
            cute.arch.sync_threads()
            self.mark(s_tl, 9)
            self.store_marks(s_tl, row_addr)


def make(variant) -> DecodeTopK:
    if variant.option("kind") == "row":
        return DecodeTopKRow(
            dtype=variant.option("dtype"),
            block_mode=variant.option("block_mode"),
            threads=variant.threads,
            hist_bins=variant.option("hist_bins"),
            groups_per_thread=variant.option("groups_per_thread"),
            list_capacity=variant.option("list_capacity"),
            smem_bytes=variant.smem_bytes,
        )
    return DecodeTopK(
        dtype=variant.option("dtype"),
        block_mode=variant.option("block_mode"),
        cluster=variant.option("cluster"),
        threads=variant.threads,
        hist_bins=variant.option("hist_bins"),
        list_capacity=variant.option("list_capacity"),
        warp_min_groups=variant.option("warp_step1_min_groups"),
        ctas_per_sm=variant.option("ctas_per_sm"),
        smem_bytes=variant.smem_bytes,
        table_tiles=variant.option("step1_table_tiles"),
    )


def compile_variant(variant, arch: str) -> bytes:
    dtype = cutlass.Float32 if variant.option("dtype") == "f32" else cutlass.BFloat16
    return cubin_of(
        make(variant),
        gmem_ptr(dtype),
        gmem_ptr(Int32),
        gmem_ptr(Int32),
        Int32(0),
        Int32(0),
        Int32(0),
        Int32(0),
        null_stream(),
        arch=arch,
    )
