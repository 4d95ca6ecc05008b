"""DecodeTopK's gathered finish, its pushes and passes (GatherMixin): each CTA's items of the threshold
bin to CTA 0's list (from the list, the slice re-read, or the table's marked groups), its output-slot bases, and
the refined floor."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr

from .. import ptx
from .common import (WARP, GATHER_VEC, GATHER_STAGE, SPARSE_SPLIT, SPARSE_SPLIT_MAX_CLUSTER, TABLE_KEY_BITS,
                     REFINE_WINDOW_BINS, PIPELINED_MARKS_MAX_CLUSTER, smem_addr, sel)


class GatherMixin:
    """The gathered finish's pushes and passes: the threshold bin's items to CTA 0."""

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
