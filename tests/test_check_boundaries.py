"""Each host check at its exact boundary: one element, one row, one page or two bytes past what it allows.

The other tests' bad inputs sat two or more rows, or 4 to 8 bytes, past a limit, and a mutation test of the checks
(the fifty-third session: 116 mutations of runtime/arguments, overlap, topk, sparse_mla, indexer and scoring) found 32
that none of them noticed: a check moved by one (``<`` for ``!=``, ``numel() > 1`` for ``numel()``), or dropped where a
later check or torch's own error stood in, after the indexer's reset or, on a GPU, past a buffer's end. Each test here
fails on its mutation; where the refusal must come before the indexer's reset, the test says so.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from indexer_cases import make_state, make_step
from odd_tensors import at_byte_offset
from test_indexer import _cpu_deepgemm_scorer
from test_scoring_args import _inputs as _scoring

from runtime import scoring
from runtime.indexer import (
    IndexerState,
    SingleRank,
    decode_rows,
    finish_decode_rows,
    plan_decode_rows,
)
from runtime.scoring import TorchScorer, check_scoring_inputs
from runtime.sparse_mla import sparse_mla_decode
from runtime.topk import decode_topk

FP8 = torch.float8_e4m3fn


def _mla(T=3, width=128):
    q = torch.zeros(T, 16, 512).to(FP8)
    pool = torch.zeros(64, 512).to(FP8)
    idx = torch.zeros(T, width, dtype=torch.int32)
    lens = torch.ones(T, dtype=torch.int32)
    return q, pool, idx, lens


def test_one_element_misaligned_row_ends():
    ends = at_byte_offset(torch.tensor([4], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="row_ends must start at a 4-byte aligned address"):
        decode_topk(torch.zeros(1, 4), ends, torch.zeros(1, 512, dtype=torch.int32))


def test_width_two_column_strided_logits():
    with pytest.raises(ValueError, match="logits must have unit column stride"):
        decode_topk(torch.zeros(2, 4)[:, ::2], torch.full((2,), 2, dtype=torch.int32),
                    torch.zeros(2, 512, dtype=torch.int32))


def test_two_rows_strided_row_ends():
    with pytest.raises(ValueError, match="row_ends must be contiguous"):
        decode_topk(torch.zeros(2, 4), torch.full((4,), 4, dtype=torch.int32)[::2],
                    torch.zeros(2, 512, dtype=torch.int32))


def test_out_with_extra_rows():
    with pytest.raises(ValueError, match=r"out must have shape \[1, k\]"):
        decode_topk(torch.zeros(1, 4), torch.full((1,), 4, dtype=torch.int32), torch.zeros(2, 512, dtype=torch.int32))


def test_indices_two_bytes_off():
    q, pool, idx, lens = _mla()
    with pytest.raises(ValueError, match="indices must start at a 4-byte aligned address"):
        sparse_mla_decode(q, pool, pool, at_byte_offset(idx, 2), lens, bmm1_scale=1.0, bmm2_scale=1.0)


def test_one_token_lens_two_bytes_off():
    q, pool, idx, lens = _mla(T=1)
    with pytest.raises(ValueError, match="lens must start at a 4-byte aligned address"):
        sparse_mla_decode(q, pool, pool, idx, at_byte_offset(lens, 2), bmm1_scale=1.0, bmm2_scale=1.0)


def test_pool_of_2_31_rows():
    q, _, idx, lens = _mla()
    meta = {"device": "meta"}
    big = torch.empty(2 ** 31, 512, dtype=FP8, **meta)
    with pytest.raises(ValueError, match=r"swa_kv has 2147483648 rows; the kernel takes a pool's row count as int32 .*"
                                         r"pass a view of the rows"):
        sparse_mla_decode(q.to("meta"), big, torch.empty(1, 512, dtype=FP8, **meta), idx.to("meta"),
                          lens.to("meta"), bmm1_scale=1.0, bmm2_scale=1.0)


def test_lens_longer_than_T():
    q, pool, idx, _ = _mla()
    with pytest.raises(ValueError, match=r"^lens must be \[T = 3\] \(T: q's tokens\), got \(4,\)$"):
        sparse_mla_decode(q, pool, pool, idx, torch.ones(4, dtype=torch.int32), bmm1_scale=1.0, bmm2_scale=1.0)


def test_sinks_longer_than_heads():
    q, pool, idx, lens = _mla()
    with pytest.raises(ValueError, match=r"sinks must be \[16\]"):
        sparse_mla_decode(q, pool, pool, idx, lens, sinks=torch.zeros(17), bmm1_scale=1.0, bmm2_scale=1.0)


def test_bool_scale():
    q, pool, idx, lens = _mla()
    with pytest.raises(TypeError, match="bmm1_scale must be a real number, got bool"):
        sparse_mla_decode(q, pool, pool, idx, lens, bmm1_scale=True, bmm2_scale=1.0)


def test_out_of_half_the_head_dim():
    q, pool, idx, lens = _mla()
    with pytest.raises(ValueError, match=r"out must be \[3, 16, 512\]"):
        sparse_mla_decode(q, pool, pool, idx, lens, bmm1_scale=1.0, bmm2_scale=1.0,
                          out=torch.empty(3, 16, 256, dtype=torch.bfloat16))


def _state_kw(step, **kw):
    a = step.state_args
    base = {"topk_indices": a["topk"].clone(), "k": a["k"], "index_k_cache": a["index_k_cache"],
            "max_model_len": a["max_model_len"], "scorer": TorchScorer()}
    base.update(kw)
    return base


def test_k_zero():
    with pytest.raises(ValueError, match="k: expected an integer >= 1, got 0"):
        IndexerState(**_state_kw(make_step(4, k=16), k=0))


@pytest.mark.parametrize("size, kind, said", [
    (8.0, TypeError, r"^candidate_block_size: expected an integer, got float 8\.0"),
    (True, TypeError, r"^candidate_block_size: expected an integer, got the bool True"),
    (16, ValueError, r"^candidate_block_size: only 8 is supported$"),
])
def test_candidate_block_size_is_the_integer_8(size, kind, said):
    """8.0 == 8 passed the comparison and the fixed state kept a float, where every other count is a whole one."""
    with pytest.raises(kind, match=said):
        IndexerState(**_state_kw(make_step(4, k=16), candidate_block_size=size))
    assert type(IndexerState(**_state_kw(make_step(4, k=16), candidate_block_size=8)).candidate_block_size) is int


def test_candidate_blocks_on_another_device():
    with pytest.raises(ValueError, match="candidate_blocks: on meta, topk_indices on cpu; allocate both on the device"):
        IndexerState(**_state_kw(make_step(4, k=16), candidate_blocks=torch.empty(4, 16, dtype=torch.int32,
                                                                                 device="meta")))


def test_key_cache_on_another_device():
    step = make_step(4, k=16)
    with pytest.raises(ValueError, match="index_k_cache: on meta, topk_indices on cpu; allocate both on the device"):
        IndexerState(**_state_kw(step, index_k_cache=step.state_args["index_k_cache"].to("meta")))


def test_transposed_topk_buffer():
    with pytest.raises(ValueError, match="topk_indices: must be contiguous"):
        IndexerState(**_state_kw(make_step(4, k=16), topk_indices=torch.zeros(16, 4, dtype=torch.int32).t()))


def test_one_row_past_the_buffer():
    step = make_step(5, k=16, max_rows=5)
    state = IndexerState(**_state_kw(step, topk_indices=torch.zeros(4, 16, dtype=torch.int32)))
    with pytest.raises(ValueError, match="metadata.num_tokens: 5 rows exceed topk_indices' 4"):
        plan_decode_rows(state, step.metadata, SingleRank())


def test_candidate_buffer_one_row_short():
    step = make_step(4, k=16)
    state = IndexerState(**_state_kw(step, candidate_blocks=torch.zeros(3, 16, dtype=torch.int32)))
    state.topk_indices.fill_(5)
    with pytest.raises(ValueError, match="metadata.num_tokens: 4 rows exceed candidate_blocks' 3"):
        decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    assert (state.topk_indices == 5).all()


def test_seq_lens_one_row_short():
    step = make_step(4, k=16)
    state = make_state(step, scorer=TorchScorer())
    md = dataclasses.replace(step.metadata, seq_lens=step.metadata.seq_lens[:3].clone())
    with pytest.raises(ValueError, match="metadata.seq_lens: 3 rows, the step has 4"):
        decode_rows(state, md, step.q, step.weights, SingleRank())


def test_metadata_block_table_column_strided():
    step = make_step(4, k=16)
    state = make_state(step, scorer=TorchScorer())
    bt = step.metadata.block_table
    wide = torch.zeros(bt.shape[0], 2 * bt.shape[1], dtype=torch.int32)
    wide[:, ::2] = bt
    md = dataclasses.replace(step.metadata, block_table=wide[:, ::2])
    with pytest.raises(ValueError, match="metadata.block_table: expected 2-D with unit last stride"):
        decode_rows(state, md, step.q, step.weights, SingleRank())


def test_block_table_one_page_short():
    step = make_step(4, k=16, max_model_len=512)
    state = make_state(step, scorer=TorchScorer())
    md = dataclasses.replace(step.metadata, block_table=step.metadata.block_table[:, :7].clone())
    with pytest.raises(ValueError, match="metadata.block_table: 7 pages of 64 do not cover max_model_len 512"):
        decode_rows(state, md, step.q, step.weights, SingleRank())


def test_block_table_one_token_short():
    """7 pages cover 448 tokens, one short of max_model_len 449 (the check moved by one, ``< max_model_len - 1``,
    took it: DeepGEMM writes logits 449 wide and reads the rows' pages up to token 448)."""
    step = make_step(4, k=16, max_model_len=449)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    md = dataclasses.replace(step.metadata, block_table=step.metadata.block_table[:, :7].clone())
    with pytest.raises(ValueError, match="metadata.block_table: 7 pages of 64 do not cover max_model_len 449"):
        decode_rows(state, md, step.q, step.weights, SingleRank())
    assert (state.topk_indices == 5).all()


def test_max_seq_len_past_the_context():
    step = make_step(4, k=16, max_model_len=512)
    md = dataclasses.replace(step.metadata, max_seq_len=513)
    with pytest.raises(ValueError, match="metadata.max_seq_len: 513 exceeds max_model_len 512"):
        decode_rows(make_state(step, scorer=TorchScorer()), md, step.q, step.weights, SingleRank())


def test_q_one_row_short():
    step = make_step(4, k=16)
    state = make_state(step, scorer=TorchScorer())
    plan = plan_decode_rows(state, step.metadata, SingleRank())
    with pytest.raises(ValueError, match=r"^q: 3 rows, the step has 4"):
        finish_decode_rows(state, step.q[:3], step.weights, plan, SingleRank())


def test_a_step_past_the_buffers_names_the_metadata_not_q():
    """A step of more rows than topk_indices holds, with q as long as the buffers: decode_rows checked q against
    metadata.num_tokens first and blamed q's rows; the metadata's own check, which names num_tokens and the buffer,
    now runs first, before anything is reset."""
    step = make_step(4, k=16)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    md = dataclasses.replace(step.metadata, num_tokens=state.max_rows + 1)
    with pytest.raises(ValueError, match=rf"^metadata.num_tokens: {state.max_rows + 1} rows exceed topk_indices' "
                                         rf"{state.max_rows}$"):
        decode_rows(state, md, step.q, step.weights, SingleRank())
    assert (state.topk_indices == 5).all()


def test_q_of_another_head_dim_named_q():
    step = make_step(4, k=16, head_dim=64)
    q = torch.zeros(4, step.q.shape[1], 32).to(FP8)
    with pytest.raises(ValueError, match="q: head_dim 32 does not match"):
        decode_rows(make_state(step, scorer=TorchScorer()), step.metadata, q, step.weights, SingleRank())


def test_weights_of_fewer_heads():
    step = make_step(4, k=16, heads=32)
    state = make_state(step, scorer=TorchScorer())
    state.topk_indices.fill_(5)
    with pytest.raises(ValueError, match=r"^weights: expected \[>= 4, 32\] \(the step's rows, q's heads\)"):
        decode_rows(state, step.metadata, step.q, step.weights[:, :16].contiguous(), SingleRank())
    assert (state.topk_indices == 5).all()


def test_scoring_weights_one_head_short():
    """The scorer's own check (a direct call, or logits(checked=False)): weights of 31 heads for q's 32 (a check of
    weights' rows alone took them, and the reference's head sum met them with torch's broadcast error)."""
    a = _scoring()
    with pytest.raises(ValueError, match=r"^weights: expected \[4, 32\] with unit column stride, got \(4, 31\)"):
        check_scoring_inputs(**{**a, "weights": a["weights"][:, :31].contiguous()})


@pytest.mark.parametrize("layout_checked", [False, True])
def test_scoring_cache_of_another_head_dim(layout_checked):
    """q of head_dim 64 against a key cache packed for head_dim 32 (rows of 36 bytes): the scorer's check of the
    cache without q's head_dim took any row width (the indexer's _check_query compares them, a direct call did not)."""
    a = _scoring()
    other = make_step(4, heads=32, head_dim=32, k=16).state_args["index_k_cache"]
    with pytest.raises(ValueError, match=r"^cache: expected \[blocks, 64, 1, 68\], got \(\d+, 64, 1, 36\)"):
        check_scoring_inputs(**{**a, "cache": other}, layout_checked=layout_checked)


def test_lean_check_refuses_cache_on_another_device():
    a = _scoring()
    a["cache"] = a["cache"].to("meta")
    with pytest.raises(ValueError, match="cache: on meta, expected cpu like q"):
        check_scoring_inputs(**a, layout_checked=True)


def test_scoring_block_table_column_strided():
    a = _scoring()
    bt = a["block_table"]
    wide = torch.zeros(bt.shape[0], 2 * bt.shape[1], dtype=torch.int32)
    wide[:, ::2] = bt
    with pytest.raises(ValueError, match="block_table: needs unit column stride"):
        check_scoring_inputs(**{**a, "block_table": wide[:, ::2]})


def test_max_model_len_zero():
    with pytest.raises(ValueError, match=r"max_model_len: expected an integer >= 1, got 0"):
        check_scoring_inputs(**_scoring(max_model_len=0))


def test_seq_lens_one_row_long():
    a = _scoring()
    with pytest.raises(ValueError, match=r"seq_lens: expected int32 \[4\]"):
        check_scoring_inputs(**{**a, "seq_lens": torch.ones(5, dtype=torch.int32)})


def test_block_table_one_row_long():
    a = _scoring()
    bt = a["block_table"]
    with pytest.raises(ValueError, match=r"block_table: expected int32 \[4, pages\]"):
        check_scoring_inputs(**{**a, "block_table": torch.cat([bt, bt[:1]])})


def test_q_eight_bytes_off_16():
    a = _scoring()
    q = a["q"]
    raw = torch.empty(q.nbytes + 64, dtype=torch.uint8)
    off = (8 - raw.data_ptr()) % 16
    a["q"] = raw[off: off + q.nbytes].view(q.dtype).view(q.shape).copy_(q)
    with pytest.raises(ValueError, match="q: DeepGEMM reads it by TMA"):
        _cpu_deepgemm_scorer().check_inputs(**a)


@pytest.mark.parametrize("name", ["seq_lens", "block_table"])
def test_deepgemm_int32_inputs_two_bytes_off(name):
    """DeepGEMM reads seq_lens and block_table by 4-byte loads; the indexer refuses them 2 bytes off (its metadata
    check), but the scorer's own check passed them, and a direct call faulted on the device."""
    a = _scoring()
    a[name] = at_byte_offset(a[name], 2)
    with pytest.raises(ValueError, match=f"{name} must start at a 4-byte aligned address"):
        _cpu_deepgemm_scorer().check_inputs(**a)


def test_head_dim_32():
    step = make_step(4, heads=32, head_dim=32, k=16)
    md = step.metadata
    with pytest.raises(ValueError, match="q: head_dim 32 must be 64 or 128"):
        _cpu_deepgemm_scorer().check_inputs(step.q, step.weights, step.state_args["index_k_cache"], md.seq_lens,
                                 md.block_table, step.state_args["max_model_len"])


def test_schedule_storage_shrunk():
    schedule = torch.zeros(5, 2, dtype=torch.int32)
    schedule.untyped_storage().resize_(8)
    with pytest.raises(ValueError, match="schedule: its view ends"):
        _cpu_deepgemm_scorer(4).check_schedule(schedule, torch.device("cpu"))


def test_index_k_cache_of_another_rank_is_a_value_error_and_of_another_dtype_a_type_error():
    """A 4-D uint8 cache is the contract: a wrong rank is a shape problem (ValueError, as the flow's other shape
    refusals), a wrong dtype or a non-tensor a type problem (TypeError)."""
    cache = torch.zeros(2, 64, 1, 68, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^cache: expected uint8 \[blocks, 64, 1, 68\], got 3 dims \(2, 64, 68\)"):
        scoring.check_index_k_cache(cache[:, :, 0], head_dim=64)
    with pytest.raises(TypeError, match=r"^cache: expected uint8 \[blocks, 64, 1, 68\], got torch.int8"):
        scoring.check_index_k_cache(cache.view(torch.int8), head_dim=64)
    with pytest.raises(TypeError, match=r"^cache: expected uint8 .*, got list"):
        scoring.check_index_k_cache([cache], head_dim=64)
