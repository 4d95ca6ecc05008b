# Sourced by the gpu jobs that score with DeepGEMM: the carried wheel installed where deep_gemm does not import
# yet (the GPU machine has no network: .whl/ travels by carry), its CUDA libraries on the loader path, its JIT
# cache directory, and that cache restored from .whl/dg_jit_cache.tgz (an earlier round's build) where carried.
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export PYTHONPATH=${PYTHONPATH:-$PWD}
if ! python3 -c "import deep_gemm" >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
  pip install -q --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 && echo "installed $(ls .whl/*.whl | xargs -n1 basename) into /tmp/site"
  export PYTHONPATH=$PYTHONPATH:/tmp/site
  SITE="$SITE /tmp/site"  # prepended last: the wheel's libraries first
fi
LIBS=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in $SITE; do
  LIBS=$s/nvidia/cu13/lib:$s/nvidia/cuda_runtime/lib:$LIBS
done
export LD_LIBRARY_PATH=$LIBS
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
if [ -f .whl/dg_jit_cache.tgz ]; then
  tar xzf .whl/dg_jit_cache.tgz -C /tmp && echo "restored $(find $DG_JIT_CACHE_DIR -type f | wc -l) cached DeepGEMM files"
fi
