"""The decode_topk cluster kernel, DecodeTopK: its configuration, shared-memory layout, launch and
kernel body (the steps themselves are in the mixins of keys, scan, selection, step1, gather and finish;
the algorithm: the package's docstring)."""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr
from cutlass.memory.smem import SmemAllocator

from .. import ptx
from ..compile import DECODE_TOPK_SWITCH
from .common import (WARP, LIST_VEC, PREFETCH_PIECE_BYTES, GATHER_STAGE, ASYNC_PUSH_MIN_CLUSTER, RAW_BINS_STEP1,
                     STEP1_BULK_DTYPES, STEP1_BULK_BYTES, EARLY_PREFETCH_MAX_CLUSTER, EARLY_PREFETCH_MIN_TILES,
                     EARLY_PREFETCH_TILES, EVICT_FIRST_MAX_CLUSTER, GATHER_STAGE_MIN_CLUSTER, TABLE_KEY_BITS,
                     REFINED_FLOOR, REFINE_WINDOW_BINS, REFINE_WINDOW_MIN_CTAS, REFINE_WINDOW_MIN_TILES,
                     REFINE_MIN_ITEMS_A_CTA, REFINE_MIN_BIN_RATIO, REFINE_MAX_CLUSTER, STAGE_NO_LIST_MIN_CLUSTER,
                     LOW_BITS_FINISH, SHORT_FLOORS_MIN_CLUSTER, smem_addr, sel)
from .finish import FinishMixin
from .gather import GatherMixin
from .keys import KeysMixin
from .scan import ScanMixin
from .selection import SelectMixin
from .step1 import Step1Mixin


class DecodeTopK(Step1Mixin, GatherMixin, FinishMixin, SelectMixin, ScanMixin, KeysMixin):
    """One variant: dtype, mode and cluster size are compile-time; k, shapes and strides are not."""

    # CuTe DSL names the cubin's kernel symbol after the instance's repr, module and class included
    # (kernel_cutlass_kernel_kernelsdecode_topkDecodeTopK_object_at_...): the class keeps the package, which exports
    # it, as its module, so the symbols and the cubins' bytes stay those of the single-module source.
    __module__ = "kernels.decode_topk"

    def __init__(self, dtype: str, block_mode: bool, cluster: int, threads: int, hist_bins: int, list_capacity: int,
                 smem_bytes: int, warp_min_groups: int, ctas_per_sm: int, table_tiles: int = 0,
                 refresh_capacity: int | None = None):
        assert dtype in ("f32", "bf16") and threads % WARP == 0 and hist_bins == 4 * threads
        assert threads // WARP <= 16  # the scan scratch holds 16 warp totals per buffer
        self.dtype = dtype
        self.block_mode = block_mode
        self.cluster = cluster
        self.threads = threads
        self.warps = threads // WARP
        self.bins = hist_bins
        self.cap = list_capacity
        # Step 1's warps refresh their bound once their segment passes this capacity's share; the list's room
        # beyond it is headroom against giving the list up (the contract's TWIN_LIST_CAPACITY).
        self.refresh_cap = list_capacity if refresh_capacity is None else refresh_capacity
        assert self.refresh_cap <= list_capacity
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
        experiment = set(os.environ.get(DECODE_TOPK_SWITCH, "").split(","))
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
