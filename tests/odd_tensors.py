"""Tensors a host op must refuse although torch reports a plain layout: data off its element size's boundary (a
storage sliced at a byte offset), and wrapper subclasses that hold no memory (DTensor and the like: data_ptr 0)."""

import torch


def int32_at_byte_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous CPU copy of int32 ``t`` whose data starts ``offset`` bytes past a 4-byte boundary."""
    storage = torch.zeros(t.numel() * 4 + 8, dtype=torch.uint8).untyped_storage()[offset:]
    view = torch.empty(0, dtype=torch.int32).set_(storage, 0, t.shape, t.contiguous().stride()).copy_(t)
    assert view.data_ptr() % 4 == offset % 4
    return view


class Storageless(torch.Tensor):
    """A wrapper subclass with ``t``'s shape, dtype and device and no memory: strided, contiguous, a storage of the
    right size, and data_ptr 0, as a DTensor reports (any torch op on it raises)."""

    @staticmethod
    def __new__(cls, t: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, dtype=t.dtype, device=t.device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"Storageless holds no data: {func}")
