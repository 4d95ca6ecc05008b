"""The short-row decode_topk kernel, DecodeTopKRow (the `_row` variants): one CTA a row, the row read
once into registers."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr

from .common import smem_addr, sel
from .kernel import DecodeTopK


class DecodeTopKRow(DecodeTopK):
    """One CTA a row, the row read once into registers: the short-row variant (contract: ROW_MAX_WIDTH).

    A row of up to threads * groups * 8 columns is loaded at once (group g = tid + i * threads:
    each warp load covers contiguous bytes) and kept in registers as keys. The first digit's
    histogram and select run on them; the items above its bin go straight to the output, the
    bin's items to a shared-memory list, and the gathered finish (the cluster kernel's, on this
    CTA alone) resolves the bin. No cluster barrier, no DSMEM, no re-read of the row.
    """

    __module__ = "kernels.decode_topk"  # the cubins' kernel symbol names it (DecodeTopK's, kernel.py, says why)

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
