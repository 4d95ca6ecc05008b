"""runtime.overlap.overlaps against a brute-force byte-set definition on random views of one buffer."""

import random

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


def _bytes_of(t: torch.Tensor) -> set:
    es = t.element_size()
    shape = t.shape if t.dim() == 2 else (1, t.numel())
    strides = t.stride() if t.dim() == 2 else (0, 1)
    return {t.data_ptr() + (r * strides[0] + c * strides[1]) * es + b
            for r in range(shape[0]) for c in range(shape[1]) for b in range(es)}


def test_overlaps_matches_brute_force():
    rng = random.Random(1)
    base = torch.zeros(256, dtype=torch.uint8)
    for _ in range(3000):
        a = _random_view(base, rng.choice([torch.uint8, torch.int32, torch.bfloat16]), rng)
        b = _random_view(base, rng.choice([torch.uint8, torch.int32, torch.float32]), rng)
        want = bool(_bytes_of(a) & _bytes_of(b))
        assert overlaps(a, b) == want and overlaps(b, a) == want, (a.shape, a.stride(), a.storage_offset(),
                                                                    b.shape, b.stride(), b.storage_offset())
