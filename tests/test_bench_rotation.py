"""The benchmarks' input rotation, on the CPU: the sets a timed graph cycles through span the L2 several times on
either card, and a graph runs whole rounds of them (the timings themselves are GPU work)."""

from __future__ import annotations

import pytest

from benchmarks import bench_indexer, bench_sparse_mla, common

L2_SIZES = {"H100": 50 << 20, "H200": 60 << 20}  # L2_cache_size as the two cards report it (the results' info)


@pytest.fixture(params=sorted(L2_SIZES))
def l2(request, monkeypatch):
    size = L2_SIZES[request.param]
    monkeypatch.setattr(common, "l2_bytes", lambda: size)
    return size


@pytest.mark.parametrize("sets", [*range(1, 45), 96, 576, 2880, 4096])
def test_a_timed_graph_runs_whole_rounds_of_its_sets(sets):
    """time_graph ran max(sets, 20) launches: 20 over 18 sets ended each replay on sets 0 and 1, which the next replay
    began with while the L2 still held them (the indexer's 1 x 64K and 8 x 8K on an H100). A graph now runs whole
    rounds: every replay begins on the set read longest ago."""
    launches = common.launches_for(sets)
    assert launches % sets == 0 and 20 <= launches < 20 + sets


def test_the_sparse_mla_kv_rotation_spans_three_l2s_in_every_case(l2):
    """Every case of the benchmark grid (issue 3's T and widths): the disjoint pool slices its calls gather from
    together hold at least L2_ROTATE_FACTOR L2s of KV rows, at least 20 of them (a graph's least launches)."""
    for T in bench_sparse_mla.TOKENS:
        for width in bench_sparse_mla.WIDTHS:
            sets = bench_sparse_mla.pool_slice_sets(T, width, bench_sparse_mla.sets_for(T, width))
            assert sets >= 20, (T, width)
            assert sets * T * width * bench_sparse_mla.D >= common.L2_ROTATE_FACTOR * l2, (T, width, sets)


def test_the_indexer_rotation_takes_the_keys_past_the_l2_at_every_size(l2):
    """Every size of issue 5: the sets' keys alone (the logits reuse one block of the step graph's pool, so they do
    not count) span more than twice the L2 (scoring_inputs gives each set its own pages of one cache)."""
    for rows, ctx in bench_indexer.ISSUE_SIZES:
        sets = bench_indexer.rotation_sets(rows, ctx)
        keys = rows * ctx * (bench_indexer.HEAD_DIM + 4)
        assert sets >= 2 and sets * keys > 2 * l2, (rows, ctx, sets)
