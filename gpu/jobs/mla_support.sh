#!/usr/bin/env bash
# limit: 240
# sparse_mla_decode support (issue 3): GPU tests of the kernel and the Triton peer against the
# reference, the benchmark (JSON to $JOB_OUT), and compute-sanitizer on small launches.
set -u
ROUND_STAGE=${MLA_STAGE:-smoke}   # smoke (early rounds) | full (tests, whole benchmark, compute-sanitizer)
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

echo "== Triton peer vs reference"
python3 -m pytest -q -m gpu tests/test_sparse_mla_gpu.py -k triton -p no:cacheprovider --timeout 240 -rs \
  2>&1 | tee "$JOB_OUT/pytest_triton.txt" | tail -n 25

echo "== AOT kernel vs reference"
python3 -m pytest -q -m gpu tests/test_sparse_mla_gpu.py -k "not triton" -p no:cacheprovider --timeout 120 -rs \
  2>&1 | tee "$JOB_OUT/pytest_kernel.txt" | tail -n 40

echo "== benchmark"
if [ "$ROUND_STAGE" = smoke ]; then
  python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json" --tokens 1 12 48
else
  python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json"
fi

if [ "$ROUND_STAGE" = full ]; then
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer $tool"
    timeout 100 compute-sanitizer --tool "$tool" --kernel-name kns=SparseMlaDecode --error-exitcode 3 \
      python3 gpu/jobs/mla_support_sanitize.py 5 2>&1 | tee "$JOB_OUT/sanitizer_$tool.txt" | tail -n 15
    echo "compute-sanitizer $tool rc=${PIPESTATUS[0]}"
  done
fi
