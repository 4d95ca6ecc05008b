"""DecodeTopK's block-wide and warp-wide helpers (ScanMixin): prefix scans (block_scan, block_scan2,
warp_incl_scan, warp_suffix_scan, warp_small_prefix), output-slot reservations (warp_slots, warp_slot1,
warp_atomic_base) and reads of the (key, index) list."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32, const_expr

from .. import ptx
from .common import WARP, smem_addr, sel


class ScanMixin:
    """Block and warp prefix scans, slot reservations and list reads."""

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
