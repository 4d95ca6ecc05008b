"""runtime.overlap: overlaps against a brute-force byte-set definition on random views of one buffer, and the
storage-extent check the host ops run on every tensor."""

import random

import pytest
import torch

from runtime.overlap import overlaps


def _random_view(base: torch.Tensor, dtype, rng: random.Random) -> torch.Tensor:
    """A contiguous 1-D slice or a 2-D row-strided view (unit column stride) of ``base`` as ``dtype``."""
    flat = base.view(dtype)
    n = flat.numel()
    if rng.random() < 0.3:
        start = rng.randrange(n)
        return flat[start:start + rng.randrange(n - start + 1)]
    rows, cols = rng.randint(1, 6), rng.randint(1, 8)
    stride = rng.randint(cols, cols + 6)
    need = (rows - 1) * stride + cols
    if need > n:
        return flat[:0]
    return flat.as_strided((rows, cols), (stride, 1), rng.randrange(n - need + 1))


def _shrunk(t: torch.Tensor, keep_bytes: int) -> torch.Tensor:
    """A view of ``t``'s values whose own storage is then shrunk to ``keep_bytes`` (as FSDP frees a parameter's
    memory with untyped_storage().resize_()): the view's metadata is unchanged, its bytes are gone."""
    view = t.clone()
    view.untyped_storage().resize_(keep_bytes)
    return view


def test_check_in_storage_against_the_view_extent():
    """Exact at the boundary, for contiguous and row-strided views, and silent for empty views."""
    from runtime.overlap import check_in_storage

    base = torch.zeros(100)
    rows = base.view(10, 10)[2:9, :5]  # ends at element 8 * 10 + 5 = 85
    tail, empty = base[60:], base[90:90]
    check_in_storage("rows", rows)
    check_in_storage("tail", tail)
    base.untyped_storage().resize_(85 * 4)
    check_in_storage("rows", rows)  # still inside: its last element is the storage's last
    check_in_storage("empty", empty)
    with pytest.raises(ValueError, match=r"tail: its view ends at byte 400 of a storage of 340 bytes"):
        check_in_storage("tail", tail)
    base.untyped_storage().resize_(85 * 4 - 1)
    with pytest.raises(ValueError, match=r"rows: its view ends at byte 340 of a storage of 339 bytes"):
        check_in_storage("rows", rows)


def test_host_ops_refuse_a_shrunk_storage():
    """Every host op names a tensor whose storage no longer holds its view, before anything reads it (on the
    CPU, torch itself would read freed memory)."""
    from runtime.sparse_mla import sparse_mla_decode
    from runtime.topk import decode_topk

    fp8 = torch.float8_e4m3fn
    q = torch.zeros(2, 16, 512).to(fp8)
    pool = torch.zeros(64, 512).to(fp8)
    indices = torch.zeros(2, 128, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="compressed_kv: its view ends at byte 32768 of a storage of 512 bytes"):
        sparse_mla_decode(q, pool, _shrunk(pool, 512), indices, lens, bmm1_scale=1.0, bmm2_scale=1.0)
    with pytest.raises(ValueError, match="out: its view ends"):
        sparse_mla_decode(q, pool, pool, indices, lens, bmm1_scale=1.0, bmm2_scale=1.0,
                          out=_shrunk(torch.zeros(2, 16, 512, dtype=torch.bfloat16), 0))

    logits = torch.zeros(2, 4096)
    ends = torch.full((2,), 4096, dtype=torch.int32)
    out = torch.zeros(2, 512, dtype=torch.int32)
    with pytest.raises(ValueError, match="logits: its view ends at byte 32768 of a storage of 16384 bytes"):
        decode_topk(_shrunk(logits, 16384), ends, out)
    with pytest.raises(ValueError, match="row_ends: its view ends"):
        decode_topk(logits, _shrunk(ends, 4), out)
    with pytest.raises(ValueError, match="out: its view ends"):
        decode_topk(logits, ends, _shrunk(out, 0))


def test_indexer_refuses_a_shrunk_storage():
    """The indexer's state buffers, metadata tensors and query: each named where its storage is shrunk."""
    import dataclasses

    from indexer_cases import make_state, make_step
    from runtime.indexer import SingleRank, decode_rows

    step = make_step(4, k=16)
    a = step.state_args
    with pytest.raises(ValueError, match="topk_indices: its view ends"):
        dataclasses.replace(make_state(step), topk_indices=_shrunk(a["topk"], 8))
    with pytest.raises(ValueError, match="index_k_cache: its view ends"):
        dataclasses.replace(make_state(step), index_k_cache=_shrunk(a["index_k_cache"], 64))
    state = make_state(step)
    md = dataclasses.replace(step.metadata, block_table=_shrunk(step.metadata.block_table, 4))
    with pytest.raises(ValueError, match="metadata.block_table: its view ends"):
        decode_rows(state, md, step.q, step.weights, SingleRank())
    with pytest.raises(ValueError, match="q: its view ends"):
        decode_rows(state, step.metadata, _shrunk(step.q, 16), step.weights, SingleRank())
    with pytest.raises(ValueError, match="weights: its view ends"):
        decode_rows(state, step.metadata, step.q, _shrunk(step.weights, 16), SingleRank())
    # A buffer shrunk after the state was built: the plan refuses it before its reset writes there.
    for name in ("topk", "candidates"):
        step = make_step(4, k=16, candidates=8)
        state = make_state(step)
        buffer = state.topk_indices if name == "topk" else state.candidate_blocks
        buffer.untyped_storage().resize_(0)
        with pytest.raises(ValueError, match=f"{'topk_indices' if name == 'topk' else 'candidate_blocks'}: its view"):
            decode_rows(state, step.metadata, step.q, step.weights, SingleRank())


def test_scorer_check_refuses_a_shrunk_storage():
    """The scorers' own input check (scorer.logits without checked=True) names a shrunk tensor too."""
    from indexer_cases import make_step
    from runtime.scoring import TorchScorer

    step = make_step(4, k=16)
    md, cache = step.metadata, step.state_args["index_k_cache"]
    args = dict(q=step.q, weights=step.weights, cache=cache, seq_lens=md.seq_lens, block_table=md.block_table,
                max_model_len=step.state_args["max_model_len"])
    for name in ("q", "weights", "cache", "seq_lens", "block_table"):
        with pytest.raises(ValueError, match=f"{name}: its view ends"):
            TorchScorer().check_inputs(**{**args, name: _shrunk(args[name], 4)})


def _any_view(base: torch.Tensor, dtype, rng: random.Random) -> torch.Tensor:
    """A view of ``base`` as ``dtype`` with 1 to 3 dimensions of any non-negative strides: column-strided, transposed,
    expanded (stride 0) or empty, as a caller's gather may return."""
    flat = base.view(dtype)
    dims = rng.randint(1, 3)
    shape = [rng.randint(0 if rng.random() < 0.05 else 1, 5) for _ in range(dims)]
    strides = [rng.choice([0, 1, 2, 3, 7, rng.randint(0, 40)]) for _ in range(dims)]
    need = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    if 0 in shape or need > flat.numel():
        return flat[:0]
    return flat.as_strided(shape, strides, rng.randrange(flat.numel() - need + 1))


def _all_bytes_of(t: torch.Tensor) -> set:
    es, index = t.element_size(), [0]
    for n, s in zip(t.shape, t.stride()):
        index = [i + k * s for i in index for k in range(n)]
    return {t.data_ptr() + i * es + b for i in index for b in range(es)}


@pytest.mark.parametrize("view, seed, size, draws", [(_random_view, 1, 256, 3000), (_any_view, 2, 512, 4000)],
                         ids=["host-op-layouts", "any-strides"])
def test_overlaps_matches_brute_force(view, seed, size, draws):
    """The host ops' layouts (contiguous, or rows of adjacent columns), then any strides (a gather's result is checked
    against the buffer it is copied into): no unpacking error, and no miss or false alarm from reading a strided view
    as runs of adjacent columns."""
    from runtime.overlap import first_overlap

    rng = random.Random(seed)
    base = torch.zeros(size, dtype=torch.uint8)
    for _ in range(draws):
        a = view(base, rng.choice([torch.uint8, torch.int32, torch.bfloat16]), rng)
        b = view(base, rng.choice([torch.uint8, torch.int32, torch.float32]), rng)
        want = bool(_all_bytes_of(a) & _all_bytes_of(b))
        got = (overlaps(a, b), overlaps(b, a), first_overlap(a, (("b", b),)) == "b",
               first_overlap(b, (("a", a),)) == "a")
        assert got == (want,) * 4, (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(), b.storage_offset())


def _many_pieces_view(base: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """An int32 view of ``base`` with four dimensions and no unit stride: more runs of adjacent columns than
    runtime.overlap reads one by one (_MAX_PIECES), so its layout is read as its whole byte span."""
    flat = base.view(torch.int32)
    shape = [rng.randint(5, 7), rng.randint(10, 12), rng.randint(10, 12), rng.randint(6, 8)]  # >= 300 pieces
    strides = [0, 0, 0, rng.randint(2, 3)]
    for i in (2, 1, 0):  # each dimension's stride past the span of the ones inside it
        strides[i] = (shape[i + 1] - 1) * strides[i + 1] + 1 + rng.randint(1, 4)
    need = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    assert need + 32 <= flat.numel()
    return flat.as_strided(shape, strides, rng.randrange(8, 32))  # 32 to 128 bytes in: probes fit before it


def test_a_layout_of_too_many_pieces_is_read_as_its_span_never_missing_a_byte():
    """A view of more than _MAX_PIECES runs is read as its byte span: "a false alarm at worst, never a miss". The
    brute-force test above never draws one (three dimensions of at most five), so a span one element short (its last
    element's bytes unseen) passed it. Here every byte the view holds, probed alone and by random views, is found,
    and a probe past either end of the span is not (the span is exact at its ends)."""
    from runtime.overlap import _MAX_PIECES, _runs, first_overlap

    rng = random.Random(3)
    base = torch.zeros(128 * 1024, dtype=torch.uint8)
    for _ in range(20):
        a = _many_pieces_view(base, rng)
        pieces = 1
        for n in sorted(a.shape)[:-1]:  # every dimension but the longest makes pieces (no unit stride: runs of one)
            pieces *= n
        assert pieces > _MAX_PIECES and type(_runs(a)) is list and len(_runs(a)) == 1, (a.shape, a.stride())
        held = _all_bytes_of(a)
        first, last = min(held) - base.data_ptr(), max(held) - base.data_ptr()
        probes = [base[first:first + 1], base[last:last + 1], base[last - 3:last + 1].view(torch.int32),
                  base[:first], base[last + 1:]]
        # The span, the bytes before it and 64 after (from base's start: _any_view's offsets are the storage's).
        window = base[:(last + 64) // 4 * 4]
        probes += [_any_view(window, rng.choice([torch.uint8, torch.int32]), rng) for _ in range(30)]
        for b in probes:
            got = (overlaps(a, b), overlaps(b, a), first_overlap(a, (("b", b),)) == "b",
                   first_overlap(b, (("a", a),)) == "a")
            bytes_of_b = _all_bytes_of(b) if b.numel() else set()
            if held & bytes_of_b:
                assert got == (True,) * 4, ("a miss", a.shape, a.stride(), b.shape, b.stride(), b.storage_offset())
            elif not bytes_of_b or max(bytes_of_b) < min(held) or min(bytes_of_b) > max(held):
                assert got == (False,) * 4, ("outside the span", a.shape, a.stride(), b.shape, b.storage_offset())


def _one_workspace_pair(base: torch.Tensor, rng: random.Random):
    """Two row-strided views of ``base`` with one row stride, as an op's out and input cut from the columns of one
    workspace: interleaved rows, each view's run shorter or longer than the gap between the other's."""
    stride = rng.randint(1, 24)
    views = []
    for _ in range(2):
        cols = rng.randint(1, stride + 3)
        rows = rng.randint(1, 9)
        need = (rows - 1) * stride + cols
        if need > base.numel():
            views.append(base[:0])
            continue
        views.append(base.as_strided((rows, cols), (stride, 1), rng.randrange(base.numel() - need + 1)))
    return views


def test_views_of_one_row_stride_match_brute_force():
    """Equal row strides are decided in closed form (the run-by-run loop took milliseconds a call for thousands of
    interleaved rows): every draw against the byte sets, both orders."""
    rng = random.Random(3)
    base = torch.zeros(160, dtype=torch.uint8)
    for _ in range(6000):
        a, b = _one_workspace_pair(base, rng)
        want = bool(_all_bytes_of(a) & _all_bytes_of(b))
        assert (overlaps(a, b), overlaps(b, a)) == (want, want), (a.shape, a.storage_offset(), b.shape,
                                                                     b.storage_offset(), a.stride())


def test_interleaved_columns_of_a_large_workspace():
    """decode_topk's out = ws[:, :512] beside logits = ws[:, 512:] of 8192 rows: apart; one column more of out
    reaches the logits' first byte of every row."""
    ws = torch.zeros(8192, 640, dtype=torch.int32)
    out, logits = ws[:, :512], ws[:, 512:]
    assert not overlaps(out, logits) and not overlaps(logits, out)
    assert overlaps(ws[:, :513], logits) and overlaps(logits, ws[:, :513])
    assert overlaps(ws[1:, :1], ws[:-1, 639:]) is False and overlaps(ws[1:, :1], ws[:-1, 638:]) is False
    assert overlaps(ws[1:, :1].view(torch.uint8), ws[:-1, 639:].view(torch.uint8)) is False
