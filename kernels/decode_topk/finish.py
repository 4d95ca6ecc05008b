"""DecodeTopK's finishes (FinishMixin): the gathered finish on CTA 0 (finish_gathered, take_ties,
select_gathered), BF16's cluster-wide finish of the last 5 bits (finish_low_bits) and the cluster-wide finish
over the remaining digits (finish_clustered)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr

from .. import ptx
from .common import WARP, SELECT_VEC, GATHER_STAGE, TIE_RANK_MAX, count_bits, smem_addr, sel


class FinishMixin:
    """Resolving the threshold bin's remaining bits and writing the selected items."""

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
