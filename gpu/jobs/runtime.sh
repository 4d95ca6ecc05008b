#!/usr/bin/env bash
# limit: 160
set -x
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
python3 -c "import torch, cuda.bindings; print(torch.__version__, torch.cuda.get_device_name(), cuda.bindings.__version__)"
python3 -m runtime verify
python3 -m pytest -q -m gpu tests/test_runtime_gpu.py -rs 2>&1 | tail -30
python3 benchmarks/bench_runtime.py "$JOB_OUT/runtime.json"
