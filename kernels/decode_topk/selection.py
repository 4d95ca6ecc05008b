"""DecodeTopK's digit selection (SelectMixin): step 2's cluster-wide select of the bin holding the
k-th largest key through distributed shared memory (cluster_select, select_bins), and the CTA's and a warp's own
k-th or highest bin (local_kth_bin, local_top_bin, warp_kth_bin)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32, const_expr

from .. import ptx
from .common import WARP, SHORT_FLOORS_MIN_CLUSTER, SELECT_WINDOW_BINS, smem_addr, sel


class SelectMixin:
    """Selecting the bin that holds the k-th largest key: cluster-wide, CTA-wide and warp-wide."""

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
