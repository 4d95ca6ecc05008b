"""decode_topk's tuning constants (each with the measurement that set it) and small free helpers
(count_bits, pairwise_sum, smem_addr, sel), shared by the package's modules."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

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
