"""Tensors a host op must refuse although torch reports a plain layout: data off its element size's boundary (a
storage sliced at a byte offset), and wrapper subclasses that hold no memory (DTensor and the like: data_ptr 0)."""

import torch


def at_byte_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous CPU copy of ``t`` whose data starts ``offset`` bytes past a 64-byte boundary (a storage sliced
    there: a dtype view of a byte tensor would refuse an offset off the element size)."""
    nbytes = t.numel() * t.element_size()
    raw = torch.zeros(nbytes + 64 + offset, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 64 + offset
    storage = raw.untyped_storage()[start:start + nbytes]
    view = torch.empty(0, dtype=t.dtype).set_(storage, 0, t.shape, t.contiguous().stride()).copy_(t)
    assert view.data_ptr() % 64 == offset % 64
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


class PointerRefused(torch.Tensor):
    """A plain tensor's subclass whose ``data_ptr()`` raises torch's RuntimeError, as some torch versions do for the
    tensors of torch.compile's tracing (FakeTensor, FunctionalTensor)."""

    def data_ptr(self):
        raise RuntimeError("Cannot access data pointer of Tensor (e.g. FakeTensor, FunctionalTensor)")
