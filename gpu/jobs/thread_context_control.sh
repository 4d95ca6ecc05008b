#!/usr/bin/env bash
# limit: 210
# Does an op launched from a thread whose first CUDA work it is fail without the launch's context binding (fifty-second
# session, Kernel.launch)? The GPU test test_a_thread_whose_first_cuda_work_is_an_op_launches_it, run on the
# fifty-first session's runtime (0b57140, carried as .whl/runtime_s51.tgz: `git archive 0b57140 runtime | gzip`) and
# then on the tree's. A pass on the old runtime says the driver found a context anyway (the mend is then defensive
# only); a failure there and a pass here says the mend is needed.
set -uo pipefail
# The old runtime looks for its cache next to its own package (/tmp/oldrt has none): both read this checkout's.
export SPARSE_DECODE_AOT_CACHE=$PWD
rm -rf /tmp/oldrt && mkdir -p /tmp/oldrt && tar -xzf .whl/runtime_s51.tgz -C /tmp/oldrt \
  || { echo "no .whl/runtime_s51.tgz (carry .whl): stopped, the tree's runtime would stand in for the old one"; exit 1; }
TEST=tests/test_runtime_gpu.py::test_a_thread_whose_first_cuda_work_is_an_op_launches_it
echo "== the fifty-first session's runtime"
# -P: no cwd first on sys.path; the run stops unless the old package is the one imported
PYTHONPATH=/tmp/oldrt:$PWD python3 -P -c "
import sys, runtime
print(runtime.__file__)
sys.exit(not runtime.__file__.startswith('/tmp/oldrt/'))" || { echo "the old runtime is not the one imported"; exit 1; }
PYTHONPATH=/tmp/oldrt:$PWD timeout 100 python3 -P -m pytest -q -p no:cacheprovider "$TEST" > /tmp/old.log 2>&1
tail -12 /tmp/old.log
echo "the old runtime's failure names CUDA_ERROR_INVALID_CONTEXT: $(grep -c CUDA_ERROR_INVALID_CONTEXT /tmp/old.log) line(s)"
echo "== this tree's runtime"
PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider "$TEST" 2>&1 | tail -5
