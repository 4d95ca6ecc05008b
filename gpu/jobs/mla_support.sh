#!/usr/bin/env bash
# limit: 240
# sparse_mla_decode support (issue 3): GPU tests of the Triton peer and the AOT kernel against the
# reference, the benchmark (JSON to $JOB_OUT), and in the full stage compute-sanitizer on small launches.
# Everything that launches the AOT kernel runs under its own timeout, so a hang costs one step only.
set -u
STAGE=${MLA_STAGE:-smoke}   # smoke (early rounds) | full (final rounds: all tests, whole benchmark, sanitizer)
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider -rs"

echo "== Triton peer vs reference"
if [ "$STAGE" = smoke ]; then sel="triton and not every_config"; else sel="triton"; fi
timeout 150 $PYTEST tests/test_sparse_mla_gpu.py -k "$sel" 2>&1 | tee "$JOB_OUT/pytest_triton.txt" | tail -n 25

echo "== benchmark"
if [ "$STAGE" = smoke ]; then toks="1 12 48"; else toks="1 6 12 24 48"; fi
timeout 150 python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json" --tokens $toks
echo "benchmark rc=$?"

echo "== AOT kernel vs reference"
timeout 120 $PYTEST -x tests/test_sparse_mla_gpu.py -k "not triton" --timeout 60 2>&1 \
  | tee "$JOB_OUT/pytest_kernel.txt" | tail -n 40

if [ "$STAGE" = full ]; then
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer $tool"
    timeout 100 compute-sanitizer --tool "$tool" --kernel-name kns=SparseMlaDecode --error-exitcode 3 \
      python3 gpu/jobs/mla_support_sanitize.py 5 2>&1 | tee "$JOB_OUT/sanitizer_$tool.txt" | tail -n 15
    echo "compute-sanitizer $tool rc=${PIPESTATUS[0]}"
  done
fi
