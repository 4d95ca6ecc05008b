"""Inputs of indexer decode steps, shared by the CPU and GPU indexer tests."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from runtime import reference
from runtime.indexer import DecodeMetadata, IndexerState, row_shard_rows


@dataclass
class Step:
    state_args: dict
    metadata: DecodeMetadata
    q: torch.Tensor
    weights: torch.Tensor


def make_step(
    rows: int,
    *,
    requests: int | None = None,
    heads: int = 32,
    head_dim: int = 64,
    max_model_len: int = 512,
    k: int = 16,
    candidates: int | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    short_rows: bool = True,
    ties: bool = False,
    signed_weights: bool = False,
) -> Step:
    """A decode step of ``rows`` rows over ``requests`` requests (rows of a request share
    its pages; row ``j`` of a request sees one more token than row ``j - 1``).

    Sequence lengths are random in [1, max_model_len], with some rows shorter than
    ``k`` (fewer candidates than k) when ``short_rows``; pages are shuffled across the
    pool. ``ties`` rounds the keys so that many logits tie exactly. The head weights are uniform in
    [0, 1) / sqrt(heads), or with ``signed_weights`` normal / sqrt(heads), both signs, as a projection gives.
    """
    requests = requests or rows
    g = torch.Generator().manual_seed(seed)
    per_request = rows // requests if requests and rows % requests == 0 else 1
    pages_per_row = -(-max_model_len // reference.INDEX_BLOCK_KV)
    num_pages = max(1, requests * pages_per_row)
    keys = torch.randn(num_pages, reference.INDEX_BLOCK_KV, head_dim, generator=g)
    if ties:
        keys = keys.sign()
    values, scales = reference.quantize_index_keys(keys)
    cache = reference.pack_index_k_cache(values, scales)

    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    tables, lens = [], []
    for r in range(rows):
        req = min(r // per_request, requests - 1) if requests else 0
        tables.append(perm[(req * pages_per_row) % num_pages:][:pages_per_row])
        lo = 1 if short_rows else min(max_model_len, k)
        base = int(torch.randint(lo, max_model_len + 1, (1,), generator=g))
        lens.append(min(max_model_len, base + r % per_request) if per_request > 1 else base)
    if short_rows and rows >= 3:
        lens[1] = max(1, min(k // 2, max_model_len))  # fewer candidates than k
    table = torch.stack([t if t.numel() == pages_per_row else torch.cat([t, perm[: pages_per_row - t.numel()]])
                         for t in tables]) if rows else torch.zeros(0, pages_per_row, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)

    q_float = torch.randn(rows, heads, head_dim, generator=g)
    if ties:
        q_float = q_float.sign()
    q = q_float.to(torch.float8_e4m3fn)
    weights = (torch.randn if signed_weights else torch.rand)(rows, heads, generator=g) * heads**-0.5
    max_rows = max_rows if max_rows is not None else max(rows, 1)

    dev = torch.device(device)
    state_args = dict(
        topk=torch.zeros(max_rows, k, dtype=torch.int32),
        k=k,
        index_k_cache=cache,
        max_model_len=max_model_len,
        candidates=None if candidates is None else torch.zeros(max_rows, candidates, dtype=torch.int32),
    )
    state_args = {key: (v.to(dev) if isinstance(v, torch.Tensor) else v) for key, v in state_args.items()}
    metadata = DecodeMetadata(
        seq_lens=seq_lens.to(dev), block_table=table.to(dev), num_requests=requests, num_tokens=rows,
        max_seq_len=int(seq_lens.max()) if rows else 0,
    )
    return Step(state_args, metadata, q.to(dev), weights.to(dev))


def make_state(step: Step, *, scorer=None, topk_backend: str = "auto", fresh: bool = True) -> IndexerState:
    """An IndexerState over fresh copies of the step's buffers (so runs do not share them)."""
    a = step.state_args
    topk = a["topk"].clone() if fresh else a["topk"]
    cand = None if a["candidates"] is None else (a["candidates"].clone() if fresh else a["candidates"])
    return IndexerState(topk_indices=topk, k=a["k"], index_k_cache=a["index_k_cache"],
                        max_model_len=a["max_model_len"], candidate_blocks=cand, scorer=scorer,
                        topk_backend=topk_backend)


class Loopback:
    """Every rank of a simulated TP group in one process: a first pass over the
    ranks records each rank's slices, a second pass returns their concatenation,
    as a real all-gather would (the kernels are deterministic, so the slices of
    both passes are the same)."""

    def __init__(self, world_size: int):
        self.world_size, self.store, self.rank, self.calls = world_size, {}, 0, 0

    def for_rank(self, rank: int) -> "Loopback":
        self.rank, self.calls = rank, 0
        return self

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        self.store.setdefault(self.calls, {})[self.rank] = local.clone()
        parts = self.store[self.calls]
        self.calls += 1
        if len(parts) < self.world_size:
            return local.new_zeros((self.world_size * local.shape[0], *local.shape[1:]))
        return torch.cat([parts[r] for r in range(self.world_size)])

    def check_sharded(self, metadata: DecodeMetadata, gathers: int) -> None:
        """Every rank took part in ``gathers`` all-gathers of ``row_shard_rows``-row slices: the step was sharded. A
        step left replicated gathers nothing, and its buffers would equal the replicated run's all the same."""
        shard = row_shard_rows(metadata.num_tokens, metadata.num_requests, self.world_size)
        assert shard is not None, "the case does not shard"
        assert sorted(self.store) == list(range(gathers)), sorted(self.store)
        for parts in self.store.values():
            assert sorted(parts) == list(range(self.world_size)), sorted(parts)
            assert all(p.shape[0] == shard for p in parts.values()), [p.shape for p in parts.values()]


@contextlib.contextmanager
def gathers_taken(dist):
    """The torch.distributed all-gathers that run inside the block, in order: "list" (``all_gather``) or "into"
    (``all_gather_into_tensor``). ``dist`` is the torch.distributed module; its functions are restored after."""
    used = []
    real_list, real_into = dist.all_gather, dist.all_gather_into_tensor
    dist.all_gather = lambda *a, **kw: used.append("list") or real_list(*a, **kw)
    dist.all_gather_into_tensor = lambda *a, **kw: used.append("into") or real_into(*a, **kw)
    try:
        yield used
    finally:
        dist.all_gather, dist.all_gather_into_tensor = real_list, real_into


def pool_rows_loop(topk: torch.Tensor, table: torch.Tensor, page_size: int) -> torch.Tensor:
    """runtime.indexer.topk_pool_rows by its definition, one element at a time in Python: position ``p`` of row
    ``r`` is pool row ``table[r, p // page_size] * page_size + p % page_size``, and -1 where there is none (``p``
    negative or at or past the table's pages, a negative page id, or a row past int32)."""
    rows, width = topk.shape
    positions, ids = topk.cpu().tolist(), table[:rows].cpu().tolist()
    pages = table.shape[1]
    out = [[-1] * width for _ in range(rows)]
    for r in range(rows):
        for c in range(width):
            p = positions[r][c]
            if p < 0 or p >= pages * page_size:
                continue
            page = ids[r][p // page_size]
            if page < 0:
                continue
            row = page * page_size + p % page_size
            if row <= 2 ** 31 - 1:
                out[r][c] = row
    return torch.tensor(out, dtype=torch.int32).reshape(rows, width)


def pool_rows_case(seed: int, rows: int, pages: int, width: int, page_size: int, *, table_rows: int | None = None,
                   k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k rows int32 [rows, width], block table int32 [table_rows, pages]) on the CPU, of every kind of entry
    topk_pool_rows maps: positions on the table's pages (most), -1 and other negatives, positions at and past the
    table's end; page ids shuffled over a pool, some -1 (unallocated), some whose rows pass int32 (some by just over
    2^32, where a row computed in int32 would wrap to a small one). Columns from ``k`` on hold -1, as an indexer
    buffer wider than k does."""
    g = torch.Generator().manual_seed(seed)
    table_rows = rows if table_rows is None else table_rows
    span = pages * page_size
    pos = torch.randint(0, max(span, 1), (rows, width), generator=g, dtype=torch.int64)
    kind = torch.randint(0, 10, (rows, width), generator=g)
    pos = torch.where(kind == 0, -1, pos)
    pos = torch.where(kind == 1, -torch.randint(2, 1000, (rows, width), generator=g), pos)
    pos = torch.where(kind == 2, span + torch.randint(0, 3 * page_size, (rows, width), generator=g), pos)
    pos[:, 0:1] = span  # the first position past the table
    if k is not None:
        pos[:, k:] = -1
    ids = torch.randint(0, 4 * max(pages, 1) * max(table_rows, 1), (table_rows, pages), generator=g)
    draw = torch.rand(table_rows, pages, generator=g)
    ids = torch.where(draw < 0.1, -1, ids)
    ids = torch.where((draw >= 0.1) & (draw < 0.15), -torch.randint(2, 1 << 30, ids.shape, generator=g), ids)
    ids = torch.where(draw > 0.95, (2 ** 31 - 1) // page_size - torch.randint(0, 2, ids.shape, generator=g), ids)
    # Ids whose rows pass 2^32 by a little: a row computed in int32 would wrap to a small positive (valid-looking) row
    wraps = -(-(2 ** 32) // page_size)
    if wraps + 1 <= 2 ** 31 - 1:
        ids = torch.where((draw > 0.9) & (draw <= 0.95), wraps + torch.randint(0, 2, ids.shape, generator=g), ids)
    return pos.to(torch.int32), ids.to(torch.int32)
