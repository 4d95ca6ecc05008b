"""Arguments of the host code. Integers: any integer type is taken (counts often arrive as numpy or
tensor-derived integers); a bool is not, though Python counts it as one: it is a flag passed in the
wrong place; nor is a tensor off the CPU, whose value would have to be read back from its device.
Tensors: dense (strided) ones only."""

from __future__ import annotations

import contextlib
import operator

import torch

# The namespace of the host ops' torch.compile custom ops (torch.ops.sparse_decode_aot.decode_topk, ...). A second copy
# of this package imported under another name in the same process (gpu/jobs/host_ab.py's side-by-side trees)
# registers its own, since torch refuses a name twice.
OP_NAMESPACE = "sparse_decode_aot" if __package__ == "runtime" else f"sparse_decode_aot_{__package__}"


def whole_number(name: str, value) -> int:
    """``value`` as a Python int, or a TypeError naming ``name``."""
    if type(value) is int:  # the common case, at one comparison (a bool's type is bool, not int)
        return value
    # First, before any repr: its value is on the device, and reading it back (here, or to print it) would wait for
    # the device, and fail inside a CUDA-graph capture with the capture's error rather than this one.
    if isinstance(value, torch.Tensor) and value.device.type != "cpu":
        raise TypeError(f"{name}: expected an integer, got a tensor on {value.device}; pass a Python int (reading a "
                        f"device tensor's value waits for the device and cannot run during CUDA-graph capture)")
    # A bool tensor (torch.tensor(True), mask.any()) passes operator.index as 1 or 0: a flag all the same.
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name}: expected an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}; pass a whole "
                        f"count") from None


def whole_count(name: str, value, minimum: int) -> int:
    """``value`` as a Python int of at least ``minimum`` (a ValueError naming ``name`` below it)."""
    number = whole_number(name, value)
    if number < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {number}")
    return number


def require_flag(name: str, value) -> None:
    """A TypeError naming ``name`` unless ``value`` is a Python bool: a stand-in (1, a numpy bool, a string) picks
    by its truth value, which for "False" is True."""
    if not isinstance(value, bool):
        kind = type(value)  # numpy's bool is also named "bool": say whose
        if isinstance(value, torch.Tensor):
            # No repr: a device tensor's reads its values back, which waits for the device and fails inside a
            # CUDA-graph capture with the capture's error rather than this one.
            raise TypeError(f"{name} must be a Python bool, got a {kind.__name__} of shape {tuple(value.shape)} on "
                            f"{value.device}; pass a Python bool (a device tensor's value cannot be read during "
                            f"CUDA-graph capture)")
        # bool() is the fix for a numpy bool or a 0/1, not for a string: bool("False") is True
        fix = (f"pass True or False (bool({value!r}) is {bool(value)})" if isinstance(value, str)
               else f"pass bool({name})")
        raise TypeError(f"{name} must be a Python bool, got {kind.__module__}.{kind.__qualname__} {value!r}; {fix}")


# torch keeps a device index in 8 signed bits: torch.device("cuda", 256) and "cuda:256" are cuda:0, 128 is cuda:-128.
MAX_DEVICE_INDEX = 127


def cuda_device_index(name: str, device) -> int | None:
    """``device`` (an index, a ``torch.device`` or its string) as a CUDA device index, or None for a device of
    another type; a device without an index is the current one. A bool, a float or a string that names no device
    is refused naming ``name`` (``int()`` would take True as device 1 and 1.7 as device 1), and so is an index past
    what torch holds, which it would wrap onto another device."""
    if isinstance(device, (str, torch.device)):
        text = device if isinstance(device, str) else None
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{name}: {device!r} names no device; pass an index or 'cuda:i'") from None
        if device.type != "cuda":
            return None
        # Checked before the index: torch reads 'cuda:255' as index -1, i.e. no index, the current device.
        if text is not None and ":" in text and text.rpartition(":")[2] != str(device.index):
            raise ValueError(f"{name}: {text!r} names a device index torch cannot hold (it reads it as "
                             f"{device}); pass an index from 0 to {MAX_DEVICE_INDEX}")
        if device.index is not None:
            if device.index < 0:  # a torch.device("cuda", 200) object holds -56
                raise ValueError(f"{name}: {device} is a wrapped device index; pass an index from 0 to "
                                 f"{MAX_DEVICE_INDEX}")
            return device.index
        # Where torch sees no CUDA device (current_device() would fail torch's own assertion), 'cuda' is cuda:0,
        # which the caller then finds it cannot serve, as it would an explicit index.
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    index = whole_count(name, device, 0)
    if index > MAX_DEVICE_INDEX:
        raise ValueError(f"{name}: device index {index} is past what torch holds (it would take it as another "
                         f"device); pass an index from 0 to {MAX_DEVICE_INDEX}")
    return index


_PLAIN_TENSOR = torch.Tensor
# Tensors with a shape and no memory the kernels could read: wrapper subclasses (DTensor) and the tensors of a
# FakeTensorMode or make_fx's tracing (torch.compile takes decode_topk and sparse_mla_decode as custom ops, and runs
# the indexer's steps eagerly, so none of its FakeTensors reaches these checks).
_NO_MEMORY_FIX = ("pass a plain tensor: a DTensor's {name}.to_local() (or {name}.full_tensor() where it is sharded); "
                  "a traced program (a FakeTensorMode, make_fx) calls the op on real tensors, or decode_topk and "
                  "sparse_mla_decode through torch.compile or their custom ops (torch.ops." + OP_NAMESPACE + ")")


def dtype_or_type(value) -> str:
    """What a dtype refusal says it was given: a tensor's dtype, or the type's name of anything else."""
    return str(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__


def _functorch_wrapped(t: torch.Tensor) -> bool:
    """Whether ``t`` is a torch.func transform's wrapper (vmap's batched tensor, grad's), where torch says."""
    test = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    return bool(test(t)) if test is not None else False


_PROXY_MODE, _FAKE_MODE = torch._C._TorchDispatchModeKey.PROXY, torch._C._TorchDispatchModeKey.FAKE


def traced() -> bool:
    """Whether torch traces this call: torch.compile (Dynamo), make_fx's and torch.export's proxy tracing, or a
    FakeTensorMode. The host ops then call their custom op, which the tracer records whole and a FakeTensorMode
    runs as its fake. Eager there, make_fx's real mode launched the kernel once at trace time and the graph kept no
    node that writes ``out`` (replayed, it returned ``out`` unwritten), and under a FakeTensorMode real arguments
    passed the checks while the ``out`` allocated for them was a FakeTensor, launched at address 0."""
    if torch.compiler.is_compiling():
        return True
    # Either mode is on torch's dispatch stack: an eager call (an empty stack) asks one question, not two
    return torch._C._len_torch_dispatch_stack() > 0 and (torch._C._get_dispatch_mode(_PROXY_MODE) is not None
                                                         or torch._C._get_dispatch_mode(_FAKE_MODE) is not None)


def _allocate_plain(name: str) -> str:
    return f"allocate {name} as a plain dense tensor and pass it (a converted copy would take the result)"


def require_dense(name: str, t: torch.Tensor, *, written: bool = False) -> None:
    """A TypeError naming ``name`` where the tensor ``t`` is not a plain strided one: sparse (COO, CSR, ...) or
    nested, which have no strides to check (CSR's ``stride()`` and a nested tensor's ``shape`` raise torch's own
    errors, which name no argument); or a view with torch's lazy negation bit (``torch._neg_view``, the imaginary
    part of a conjugate view), whose memory holds the values un-negated: the kernels read the memory; or one without
    memory to read (a wrapper subclass such as DTensor, a FakeTensor of a FakeTensorMode or make_fx's tracing, a
    tensor whose data pointer torch refuses). ``written``: the op writes ``t`` (an ``out``), so a converted copy is
    no fix (the copy would take the result, not the caller's tensor): the fix is to allocate it plain."""
    if t.layout != torch.strided:
        fix = _allocate_plain(name) if written else f"pass {name}.to_dense()"
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}; {fix}")
    if t.is_nested:
        fix = _allocate_plain(name) if written else f"pass one padded tensor ({name}.to_padded_tensor(0))"
        raise TypeError(f"{name} must be a dense (strided) tensor, got a nested tensor; {fix}")
    if t.is_neg():
        fix = _allocate_plain(name) if written else f"pass {name}.resolve_neg()"
        raise TypeError(f"{name} is a lazily negated view (its memory holds the values un-negated); {fix}")
    # A FakeTensor (a FakeTensorMode, make_fx's tracing) is named before its data_ptr() read, which torch
    # warns about or refuses (versions differ) with a message naming no argument; a plain tensor pays one type
    # comparison here (inline: the checks run on every eager call).
    if type(t) is not _PLAIN_TENSOR and getattr(t, "fake_mode", None) is not None:
        raise TypeError(f"{name} is a FakeTensor: a shape without memory, which the kernels would read; "
                        + _NO_MEMORY_FIX.format(name=name))
    try:
        ptr = t.data_ptr()
    except RuntimeError as e:
        if _functorch_wrapped(t):  # its fix is not a DTensor's or a trace's
            raise TypeError(f"{name} is a tensor of a torch.func transform (torch.vmap, torch.func.grad, ...), which "
                            f"the op has no batching or autograd rule for; call it outside the transform (a vmapped "
                            f"batch as rows of one call)") from None
        raise TypeError(f"{name} is a {type(t).__name__} whose data pointer torch does not give ({e}); "
                        + _NO_MEMORY_FIX.format(name=name)) from None
    if not ptr and t.numel() and not t.is_meta and t.untyped_storage().nbytes():
        # A wrapper subclass (DTensor, ...) reports a plain layout, shape and storage size but holds no memory: its
        # data_ptr is 0, which a kernel would dereference. (A meta tensor has none either, and no kernel takes one; a
        # storage shrunk to nothing is named by check_in_storage.)
        raise TypeError(f"{name} is a {type(t).__name__} without memory of its own (data_ptr 0); "
                        + _NO_MEMORY_FIX.format(name=name))


def require_element_aligned(name: str, t: torch.Tensor) -> None:
    """A ValueError naming ``name`` where ``t``'s data starts off a multiple of its element size, as over a storage
    sliced at a byte offset: a kernel's element-wide loads and stores of it (the AOT kernels', DeepGEMM's) would
    fault on the device, which leaves the process's CUDA context unusable. An empty tensor is never read."""
    size = t.element_size()
    if t.data_ptr() % size and t.numel():
        raise ValueError(f"{name} must start at a {size}-byte aligned address (its data_ptr is "
                         f"{t.data_ptr() % size} bytes past one): pass a tensor that torch allocated, or a view of one")


def write_result(out: torch.Tensor, result: torch.Tensor) -> None:
    """``out.copy_(result)`` for a host op's exact fallback, taking every ``out`` its kernel takes: the kernels write
    through the pointer, whatever autograd or inference mode says of the tensor. An ``out`` made under
    ``torch.inference_mode()`` (a serving engine's buffers allocated at start-up) and passed outside it, or one that
    requires grad, refused the copy with torch's RuntimeError, naming no argument, after the whole reference ran."""
    mode = torch.inference_mode() if out.is_inference() else contextlib.nullcontext()
    with torch.no_grad(), mode:
        out.copy_(result)


def mark_written(out: torch.Tensor) -> None:
    """Bump ``out``'s autograd version counter after a kernel wrote it through its pointer, as torch's in-place ops
    and the fallback's ``copy_`` do: a tensor that autograd saved for a backward pass and a kernel then overwrote
    raises at the backward instead of giving a gradient from the new values. An inference tensor has no counter:
    torch leaves it alone."""
    torch.autograd.graph.increment_version(out)
