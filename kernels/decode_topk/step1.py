"""DecodeTopK's step 1 (Step1Mixin): the warp loop of long slices with its bound and list segments
(step1_warp, warp_filter, shared_bound), the CTA-tile loops of short slices (step1_tiles, step1_tiles_raw,
step1_tiles_bulk with its bulk copies), the raw-order bins, the refine window and the table keys."""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr

from .. import ptx
from .common import (WARP, LIST_VEC, PREFETCH_PIECE_BYTES, STEP1_PREFETCH_AHEAD, TABLE_KEY_BITS, REFINE_WINDOW_BINS,
                     BOUND_SHARE_CLUSTERS, BOUND_SHARE_PERIOD, count_bits, pairwise_sum, smem_addr, sel)


class Step1Mixin:
    """Step 1: one read of the CTA's slice into the first digit's histogram."""

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
        refresh_at = min(self.refresh_cap // W, seg_cap)
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
                if n_w + tot > refresh_at:
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
