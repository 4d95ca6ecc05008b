"""Build-time kernel sources (CuTe DSL). Never imported by ``runtime/``.

Each family module (or package) exposes ``compile_variant(variant, arch) -> bytes`` that
compiles one ``runtime.contract.Variant`` for one target arch and returns the
cubin bytes taken from CuTe DSL's compile artifacts.
"""

import importlib

BUILDERS = {
    "probe": "kernels.probe",
    "empty": "kernels.empty",
    "sparse_mla_decode": "kernels.sparse_mla_decode",
    "decode_topk": "kernels.decode_topk",
    "topk_pool_rows": "kernels.topk_pool_rows",
}


def compile_variant(variant, arch: str) -> bytes:
    module = importlib.import_module(BUILDERS[variant.family])
    return module.compile_variant(variant, arch)
