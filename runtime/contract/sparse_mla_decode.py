"""The sparse-MLA decode family (DESIGN.md "sparse_mla_decode"), Hopper cluster kernel.

One CTA of 128 threads per (token, 128-column chunk); the ``width / 128`` chunks
of a token form one thread-block cluster along x, so the grid is
``T * cluster`` CTAs and CTA ``b`` serves token ``b // cluster``, chunk
``b % cluster``. Every variant takes the same parameters; ``sinks`` is ignored
(may be 0) where ``has_sinks`` is off. Pool row counts bound the indices: an
index at or past them is masked, never read.
"""

from . import Variant, params

HEADS = 16
HEAD_DIM = 512
CHUNK = 128  # columns per CTA
WIDTHS = (128, 640)
THREADS = 128
# The kernel's finite stand-in for -inf in its (max, sum) algebra, which keeps 0 * ... free of NaN: a chunk's max
# is floored there. The host op bounds bmm1_scale so that every score stays well above it.
NEG_BIG = -3.0e38

PARAMS = params(
    "void* out",  # [T, 16, 512] BF16
    "void* q",  # [T, 16, 512] FP8 E4M3
    "void* swa_kv",  # [swa_rows, 512] FP8 E4M3, columns [0, 128)
    "void* compressed_kv",  # [compressed_rows, 512] FP8 E4M3, columns [128, width)
    "void* indices",  # [T, width] int32
    "void* lens",  # [T] int32
    "void* sinks",  # [16] float32 (read only when has_sinks)
    "int32_t swa_rows",
    "int32_t compressed_rows",
    "float bmm1_scale",
    "float bmm2_scale",
)
# The bytes the host op guarantees for each pointer's start (runtime.sparse_mla checks them): the most a kernel may
# declare for it at compile (kernels.compile.gmem_ptr), since the compiler may vectorize on what it is told.
POINTER_ALIGN = {"out": 16, "q": 16, "swa_kv": 16, "compressed_kv": 16, "indices": 4, "lens": 4, "sinks": 4}

# Shared memory a CTA uses (bytes): KV tile 64 KiB, query 8 KiB, P^T 2 KiB,
# softmax/cluster scratch and barrier, plus 1 KiB to align the base to the
# 128-byte swizzle's 1024-byte repeat. 2 CTAs fit an SM (<= ~113 KB each).
SMEM_BYTES = 65536 + 8192 + 2048 + 2048 + 1024
# Cluster reduction: FP16 partials staged, then bulk copies into the owner's KV tile.
REDUCE = "bulk"


def _variant(width: int, has_sinks: bool) -> Variant:
    n = width // CHUNK
    return Variant(
        family="sparse_mla_decode",
        name=f"sparse_mla_decode_w{width}_{'sinks' if has_sinks else 'nosinks'}",
        params=PARAMS,
        threads=THREADS,
        cluster=(n, 1, 1),
        smem_bytes=SMEM_BYTES,
        pdl=True,
        config=(("width", width), ("has_sinks", has_sinks), ("heads", HEADS), ("head_dim", HEAD_DIM),
                ("reduce", REDUCE)),
        archs=("sm_90a",),
    )


VARIANTS = tuple(_variant(w, s) for w in WIDTHS for s in (True, False))


def variant_name(width: int, has_sinks: bool) -> str:
    return f"sparse_mla_decode_w{width}_{'sinks' if has_sinks else 'nosinks'}"
