# Sourced by the gpu jobs that score with DeepGEMM: its CUDA libraries on the loader path, its JIT cache
# directory, and that cache restored from .whl/dg_jit_cache.tgz (an earlier round's build) where carried.
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:$SITE/nvidia/cuda_runtime/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
if [ -f .whl/dg_jit_cache.tgz ]; then
  tar xzf .whl/dg_jit_cache.tgz -C /tmp && echo "restored $(find $DG_JIT_CACHE_DIR -type f | wc -l) cached DeepGEMM files"
fi
