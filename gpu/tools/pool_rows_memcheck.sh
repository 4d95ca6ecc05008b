#!/usr/bin/env bash
# topk_pool_rows' GPU tests under compute-sanitizer memcheck, device faults only (the loader's validation makes CUDA
# API errors on purpose). The test past the kernel's columns is left out: it runs the torch chain on 16M columns,
# which memcheck would take minutes over, and no kernel of the cache. Used by host_changes.sh and verify_all.sh.
# Usage: bash gpu/tools/pool_rows_memcheck.sh [SECONDS]; exit status: the sanitizer's (3: errors found; the tests'
# own failures too), 124 past SECONDS (default 90), 127 without compute-sanitizer on PATH.
set -u
export SPARSE_DECODE_AOT_REQUIRE_GPU=1  # a test that would skip (no device seen under the tool) fails
# Every tensor its own allocation: a read past a pool's end is then outside any allocation memcheck knows (inside
# torch's cached block it would be a valid address; gpu/tools/mla_sanitize.sh).
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
if ! command -v compute-sanitizer >/dev/null; then
  echo "no compute-sanitizer on PATH: topk_pool_rows' memcheck did not run"
  exit 127
fi
timeout "${1:-90}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_indexer_gpu.py -k "pool_rows and not past_the_kernels"
