"""DecodeTopK's keys and loads (KeysMixin): the raw 16-byte group loads and their L2 prefetches, the
order-preserving key of a logit, the step-1 filter's per-item tests, and the bounds of a first-digit bin."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr

from .. import ptx
from .common import PACKED_BF16_KEYS, count_bits, pairwise_sum, sel


class KeysMixin:
    """Per-group loads, order-preserving keys and the item tests of step 1's filter."""

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
