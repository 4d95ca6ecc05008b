"""Tensors whose data starts off their element size's boundary: what a storage sliced at a byte offset gives."""

import torch


def int32_at_byte_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous CPU copy of int32 ``t`` whose data starts ``offset`` bytes past a 4-byte boundary."""
    storage = torch.zeros(t.numel() * 4 + 8, dtype=torch.uint8).untyped_storage()[offset:]
    view = torch.empty(0, dtype=torch.int32).set_(storage, 0, t.shape, t.contiguous().stride()).copy_(t)
    assert view.data_ptr() % 4 == offset % 4
    return view
