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

The package, a module a concern (DecodeTopK is its mixins' sum; this module: make, compile_variant):
    common.py     the tuning constants (each with the measurement that set it), small free helpers
    kernel.py     DecodeTopK: configuration, shared-memory layout, launch, the kernel body, timeline marks
    keys.py       KeysMixin: group loads and prefetches, keys, step 1's per-item tests, bin bounds
    scan.py       ScanMixin: block and warp scans, output-slot reservations, list reads
    selection.py  SelectMixin: the bin of the k-th largest key (step 2; the CTA's and a warp's own)
    step1.py      Step1Mixin: step 1's warp loop and CTA-tile loops (bulk tiles, raw bins, refine window, table)
    gather.py     GatherMixin: the gathered finish's pushes and passes, the refined floor
    finish.py     FinishMixin: finish_gathered (take_ties, select_gathered), finish_low_bits, finish_clustered
    row.py        DecodeTopKRow, the short-row kernel
"""

from __future__ import annotations

import cutlass
from cutlass import Int32

from runtime.contract import decode_topk as contract

from ..compile import contract_pointers, cubin_of, null_stream
from .kernel import DecodeTopK
from .row import DecodeTopKRow

__all__ = ["DecodeTopK", "DecodeTopKRow", "compile_variant", "make"]


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
        refresh_capacity=variant.option("list_refresh_capacity"),
        warp_min_groups=variant.option("warp_step1_min_groups"),
        ctas_per_sm=variant.option("ctas_per_sm"),
        smem_bytes=variant.smem_bytes,
        table_tiles=variant.option("step1_table_tiles"),
    )


def compile_variant(variant, arch: str) -> bytes:
    dtype = cutlass.Float32 if variant.option("dtype") == "f32" else cutlass.BFloat16
    return cubin_of(
        make(variant),
        *contract_pointers(contract, {"logits": dtype, "row_ends": Int32, "out": Int32}),
        Int32(0),
        Int32(0),
        Int32(0),
        Int32(0),
        null_stream(),
        arch=arch,
    )
