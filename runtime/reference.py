"""One torch reference per operation, runnable on the CPU.

Tests compare the kernels with these, the host ops' exact fallbacks call them,
and the benchmarks time them as a peer. Each op keeps its functions together
under its own heading.
"""

from __future__ import annotations

import torch

from .arguments import whole_count


# ---------------------------------------------------------------------------
# sparse_mla_decode
# ---------------------------------------------------------------------------

SPARSE_MLA_HEADS = 16
SPARSE_MLA_HEAD_DIM = 512
SPARSE_MLA_SWA_COLUMNS = 128  # the first 128 columns of a sparse set address the sliding-window pool


def sparse_mla_active(indices, lens, swa_rows: int, compressed_rows: int):
    """Which columns of each token's sparse set take part: ``[T, width]`` bool.

    A column is active when it lies before the token's ``lens`` and its index is a row of its
    pool (``0 <= idx < rows``); -1, columns at or past ``lens`` and indices past the pool are
    masked. The first 128 columns address the sliding-window pool, the rest the compressed pool.
    """
    idx = indices.long()
    width = idx.shape[1]
    cols = torch.arange(width, device=idx.device)
    rows = torch.where(cols < SPARSE_MLA_SWA_COLUMNS, swa_rows, compressed_rows)
    return (cols[None, :] < lens.long()[:, None]) & (idx >= 0) & (idx < rows[None, :])


def _gather_rows(pool, idx, active):
    """FP8 rows ``pool[idx]`` as FP64 (see _products), zeros where not active (gathered as bytes: no FP8
    indexing)."""
    if pool.shape[0] == 0:
        return torch.zeros(*idx.shape, pool.shape[1], dtype=torch.float64, device=pool.device)
    safe = torch.where(active, idx, torch.zeros_like(idx))
    rows = pool.view(torch.uint8)[safe].view(pool.dtype).double()
    # where, not a product: row 0 stands in for masked columns, and a NaN byte there
    # (a pool's padding slot, uninitialized memory) would survive a multiply by zero.
    return torch.where(active[..., None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def sparse_mla_decode_reference(q, swa_kv, compressed_kv, indices, lens, *, sinks=None,
                                bmm1_scale, bmm2_scale, tokens_per_chunk: int = 32):
    """Sparse-MLA decode in FP32 on the dequantized FP8 inputs; BF16 ``[T, 16, 512]`` out. The two products
    accumulate in FP64 (``_products``: no process-wide matmul setting lowers their precision).

    For token ``t``, head ``h`` and the token's active columns ``c`` (``sparse_mla_active``)::

        s_c = bmm1_scale * q[t, h] . kv[c]          m = max(max_c s_c, sinks[h])
        out[t, h] = bmm2_scale * sum_c exp(s_c - m) kv[c] / (sum_c exp(s_c - m) + exp(sinks[h] - m))

    ``kv[c]`` is row ``indices[t, c]`` of ``swa_kv`` for the first 128 columns and of
    ``compressed_kv`` for the rest. Without sinks the sink terms are absent. A token with no
    active column gets zeros (with sinks too). Runs on the inputs' device (CPU included), a
    chunk of ``tokens_per_chunk`` tokens at a time so the gathered rows (FP64: 32 tokens x 640 x 512 x 8 bytes,
    84 MB a copy at the default) stay bounded.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [T, heads, head_dim], got shape {tuple(q.shape)}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"indices must be [T, width] with T = {q.shape[0]}, got {tuple(indices.shape)}")
    if lens.shape != (q.shape[0],):
        raise ValueError(f"lens must be [T] with T = {q.shape[0]}, got {tuple(lens.shape)}")
    T, H, D = q.shape
    if sinks is not None and sinks.shape != (H,):
        raise ValueError(f"sinks must be [heads] = [{H}], got {tuple(sinks.shape)}; pass one sink a head, or None")
    width = indices.shape[1]
    n_swa = min(width, SPARSE_MLA_SWA_COLUMNS)
    out = torch.zeros(T, H, D, dtype=torch.bfloat16, device=q.device)
    sink = None if sinks is None else sinks.float().view(1, H)
    for t0 in range(0, T, tokens_per_chunk):
        t1 = min(T, t0 + tokens_per_chunk)
        idx = indices[t0:t1].long()
        active = sparse_mla_active(indices[t0:t1], lens[t0:t1], swa_kv.shape[0], compressed_kv.shape[0])
        kv = torch.cat([_gather_rows(swa_kv, idx[:, :n_swa], active[:, :n_swa]),
                        _gather_rows(compressed_kv, idx[:, n_swa:], active[:, n_swa:])], dim=1)
        s = _products(q[t0:t1], kv.transpose(1, 2)) * float(bmm1_scale)  # [t, H, width]
        s = s.masked_fill(~active[:, None, :], float("-inf"))
        m = s.amax(dim=-1)  # [t, H]; -inf for a token without active columns
        if sink is not None:
            m = torch.maximum(m, sink)
        # All -inf (no active column, no sink): any finite m keeps exp() at 0, not NaN. A +inf sink stays the max:
        # every column's weight is 0 and the sink's is 1 (exp(inf - inf) would be NaN), so the head's output is 0.
        m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        p = torch.exp(s - m[..., None])
        denom = p.sum(dim=-1)
        if sink is not None:
            denom = denom + torch.where(sink == m, torch.ones_like(m), torch.exp(sink - m))
        o = _products(p, kv) * (float(bmm2_scale) / torch.where(denom > 0, denom, torch.ones_like(denom)))[..., None]
        o = torch.where(active.any(dim=1)[:, None, None], o, 0.0)  # no active column: zeros, with sinks too
        out[t0:t1] = o.to(torch.bfloat16)
    return out


def _products(a, b):
    """``a @ b`` as FP32, accumulated in FP64. A process may lower FP32 matmuls globally (TF32 through
    ``torch.backends.cuda.matmul.allow_tf32``, BF16 through ``torch.set_float32_matmul_precision``), which
    would make this reference, and so the op's exact fallback, round its inputs to 10 or 7 mantissa bits;
    FP64 has no such mode, holds the FP8 inputs' products exactly, and its sums are at least as close as
    FP32's. (On the H200, FP64 tensor-core matmuls run about as fast as FP32 without TF32.)"""
    return torch.matmul(a.double(), b.double()).float()


# ---------------------------------------------------------------------------
# indexer (paged MQA logits over the FP8 index-key cache, top-k selection)
# ---------------------------------------------------------------------------

INDEX_BLOCK_KV = 64  # tokens per page of the index-key cache (DeepGEMM's only Hopper page size)
INDEX_SCALE_BYTES = 4  # one FP32 scale per cached key
FP8_E4M3_MAX = 448.0


def quantize_index_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-key FP8 E4M3 quantization: ``(values [..., D] fp8, scales [...] fp32)``.

    The scale maps each key's largest magnitude onto the FP8 range, so that
    ``values.float() * scales[..., None]`` approximates ``keys``.
    """
    amax = keys.float().abs().amax(dim=-1).clamp(min=1e-8)
    scales = amax / FP8_E4M3_MAX
    values = (keys.float() / scales[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return values.to(torch.float8_e4m3fn), scales


def pack_index_k_cache(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fused paged layout DeepGEMM reads: uint8 ``[blocks, 64, 1, D + 4]``.

    Each page holds its 64 keys' FP8 values (``64 * D`` bytes, key-major) followed
    by their 64 FP32 scales; the 4-D shape only fixes the page stride.
    """
    blocks, block_kv, dim = values.shape
    if scales.shape != (blocks, block_kv):
        raise ValueError(f"scales: expected shape {(blocks, block_kv)}, got {tuple(scales.shape)}")
    page = torch.cat(
        [values.contiguous().view(torch.uint8).reshape(blocks, block_kv * dim),
         scales.float().contiguous().view(torch.uint8).reshape(blocks, block_kv * INDEX_SCALE_BYTES)],
        dim=1,
    )
    return page.view(blocks, block_kv, 1, dim + INDEX_SCALE_BYTES)


def unpack_index_k_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_index_k_cache``: ``(values [blocks, 64, D] fp8, scales [blocks, 64] fp32)``."""
    blocks, block_kv, _, width = cache.shape
    dim = width - INDEX_SCALE_BYTES
    flat = cache.reshape(blocks, block_kv * width)
    values = flat[:, : block_kv * dim].contiguous().view(torch.float8_e4m3fn).view(blocks, block_kv, dim)
    scales = flat[:, block_kv * dim:].contiguous().view(torch.float32).view(blocks, block_kv)
    return values, scales


def indexer_logits_reference(
    q: torch.Tensor,
    weights: torch.Tensor,
    cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    rows_per_chunk: int = 4,
) -> torch.Tensor:
    """FP32 paged MQA logits of each row over its own keys (what DeepGEMM computes).

    ``logits[r, t] = scale_t * sum_h weights[r, h] * max(q[r, h] . k_t, 0)`` for
    ``t < seq_lens[r]``, where key ``t`` of row ``r`` sits in page
    ``block_table[r, t // 64]``; columns at or past ``seq_lens[r]`` are ``-inf``.
    As DeepGEMM's kernels compute it (the key's scale outside the clamp, ``fmaxf``'s max, which takes a NaN product as
    0); its own test's torch reference clamps the scaled product instead, which differs only for a negative scale or
    a NaN. The dot products accumulate in FP64 (``_products``). Rows are processed a few
    at a time to bound the gathered keys' memory.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [rows, heads, head_dim], got shape {tuple(q.shape)}")
    rows, heads, dim = q.shape
    for name, t, want in (("weights", weights, (rows, heads)), ("seq_lens", seq_lens, (rows,))):
        if tuple(t.shape) != want:
            raise ValueError(f"{name} must have shape {list(want)} (q's rows and heads), got {tuple(t.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != rows:
        raise ValueError(f"block_table must be [rows = {rows}, pages], got {tuple(block_table.shape)}")
    values, scales = unpack_index_k_cache(cache)
    block_kv = values.shape[1]
    pages = min(-(-max_model_len // block_kv), block_table.shape[1])
    out = torch.full((rows, max_model_len), float("-inf"), dtype=torch.float32, device=q.device)
    cols = torch.arange(max_model_len, device=q.device)
    for r0 in range(0, rows, rows_per_chunk):
        r1 = min(rows, r0 + rows_per_chunk)
        table = block_table[r0:r1, :pages].long().clamp(min=0, max=values.shape[0] - 1)
        keys = values[table].double().reshape(r1 - r0, pages * block_kv, dim)
        key_scales = scales[table].reshape(r1 - r0, pages * block_kv)
        dots = _products(q[r0:r1], keys.transpose(1, 2))
        clamped = torch.where(dots > 0, dots, 0.0)  # fmaxf(dot, 0): a NaN product is 0 (clamp would keep it)
        scores = ((clamped * weights[r0:r1].float()[:, :, None]).sum(dim=1) * key_scales)[:, :max_model_len]
        width = scores.shape[1]
        valid = cols[None, :width] < seq_lens[r0:r1, None].long()
        out[r0:r1, :width] = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
    return out


# ---------------------------------------------------------------------------
# decode_topk (exact top-k of indexer logits rows; token and block mode)
# ---------------------------------------------------------------------------

DECODE_TOPK_BLOCK = 8  # columns per candidate block in block mode
# decode_topk_reference ranks (key, index) as one int64: 32 key bits over 31 index bits (2**63 - 1 at most).
_INDEX_BITS = 31
_INDEX_MASK = (1 << _INDEX_BITS) - 1


def decode_topk_keys(logits: torch.Tensor) -> torch.Tensor:
    """Order-preserving int64 keys of FP32/BF16 logits (what the kernel compares).

    Larger value -> larger key; NaN gets the key of -inf and -0 that of +0, so equal
    keys are exactly equal values (ties). Keys are >= 0; FP32 keys use 32 bits, BF16 16.
    """
    if logits.dtype == torch.float32:
        bits, sign, full = logits.view(torch.int32).long() & 0xFFFFFFFF, 1 << 31, 0xFFFFFFFF
        ninf = 0xFF800000
    elif logits.dtype == torch.bfloat16:
        bits, sign, full = logits.view(torch.int16).long() & 0xFFFF, 1 << 15, 0xFFFF
        ninf = 0xFF80
    else:
        raise TypeError(f"logits: expected float32 or bfloat16, got {logits.dtype}")
    mag = bits & (sign - 1)
    bits = torch.where(mag > (ninf & (sign - 1)), torch.full_like(bits, ninf), bits)  # NaN -> -inf
    bits = torch.where(mag == 0, torch.zeros_like(bits), bits)  # -0 -> +0
    return torch.where(bits >= sign, full - bits, bits | sign)


def decode_topk_reference(logits: torch.Tensor, row_ends: torch.Tensor, k: int, *,
                          block_mode: bool = False) -> torch.Tensor:
    """Exact top-k per row: int32 ``[rows, k]``, best first (largest value, then lower index).

    Row ``r`` has candidates: columns ``< clip(row_ends[r], 0, width)`` in token mode; in
    block mode blocks ``b`` with ``8b < that end``, each scored by the max of its columns
    before the end. NaN counts as -inf; ties go to the lower index; a row with fewer than
    ``k`` candidates gets all of them, then -1. Exact for any ties: ranks one int64
    ``(key << 31) | (2**31 - 1 - index)`` per candidate (keys < 2**32, indices < 2**31: it takes rows wider than
    the kernels' ``runtime.topk.MAX_WIDTH``).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits: expected [rows, width], got shape {tuple(logits.shape)}")
    rows, width = logits.shape
    if width > _INDEX_MASK:
        raise ValueError(f"logits: width {width} exceeds {_INDEX_MASK} columns (int32 indices)")
    # The host ops' count check (a TypeError for a bool, float or tensor, which this let through as k = 1 from a
    # bool tensor; a ValueError below 0), an int or what indexes as one (a SymInt, a NumPy integer) passing.
    k = whole_count("k", k, 0)
    if row_ends.shape != (rows,):
        raise ValueError(f"row_ends must be [rows] = [{rows}], got {tuple(row_ends.shape)}; pass one end a row")
    keys = decode_topk_keys(logits)
    ends = row_ends.to(device=logits.device, dtype=torch.long).clamp(min=0, max=width)
    cols = torch.arange(width, device=logits.device)
    keys = torch.where(cols[None, :] < ends[:, None], keys, torch.full_like(keys, -1))
    if block_mode:
        blocks = -(-width // DECODE_TOPK_BLOCK)
        padded = torch.full((rows, blocks * DECODE_TOPK_BLOCK), -1, dtype=torch.long, device=logits.device)
        padded[:, :width] = keys
        keys = padded.view(rows, blocks, DECODE_TOPK_BLOCK).amax(dim=2)
        width = blocks
    index = torch.arange(width, device=logits.device)
    ranked = (keys << _INDEX_BITS) | (_INDEX_MASK - index)[None, :]
    ranked = torch.where(keys >= 0, ranked, torch.full_like(ranked, -1))  # not a candidate
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    take = min(k, width)
    if take:
        best = torch.topk(ranked, take, dim=1).values
        chosen = (_INDEX_MASK - (best & _INDEX_MASK)).to(torch.int32)
        out[:, :take] = torch.where(best >= 0, chosen, torch.full_like(chosen, -1))
    return out
