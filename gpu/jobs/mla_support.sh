#!/usr/bin/env bash
# limit: 300
# sparse_mla_decode support (issue 3): the AOT kernel and the Triton peer against the reference
# (tests/test_sparse_mla_gpu.py), the benchmark (JSON + table to $JOB_OUT), and compute-sanitizer
# memcheck/racecheck/synccheck on small launches. Steps run in priority order, each under its own
# timeout cut to the time left (this limit or ROUND_CAP, whichever is smaller), so a hang or a
# short round costs the later steps only. MLA_STAGE=smoke|full (default: full when >= 240 s remain).
set -u
limit=300
[ -n "${ROUND_CAP:-}" ] && [ "$ROUND_CAP" -lt "$limit" ] && limit=$ROUND_CAP
end=$((SECONDS + limit - 8))
STAGE=${MLA_STAGE:-$([ "$limit" -ge 240 ] && echo full || echo smoke)}
left() { local l=$((end - SECONDS)); [ "$l" -gt "$1" ] && l=$1; echo $(( l > 0 ? l : 1 )); }
PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider -rs"
echo "stage $STAGE, ${limit}s"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

echo "== AOT kernel vs reference"
timeout "$(left 90)" $PYTEST tests/test_sparse_mla_gpu.py -k "not triton" --timeout 60 2>&1 \
  | tee "$JOB_OUT/pytest_kernel.txt" | grep -v "^    \|^E  *\[\|^E  *+  *where" | tail -n 40

echo "== benchmark"
if [ "$STAGE" = smoke ]; then bench_args="--tokens 1 12 48 --quick-sweep"; else bench_args=""; fi
timeout "$(left 150)" python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json" $bench_args
echo "benchmark rc=$?"

echo "== Triton peer vs reference"
if [ "$STAGE" = smoke ]; then sel="triton and not every_config"; else sel="triton"; fi
timeout "$(left 120)" $PYTEST tests/test_sparse_mla_gpu.py -k "$sel" 2>&1 \
  | tee "$JOB_OUT/pytest_triton.txt" | grep -v "^    \|^E  *\[\|^E  *+  *where" | tail -n 30

if [ "$STAGE" = full ]; then
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer $tool"
    timeout "$(left 90)" compute-sanitizer --tool "$tool" --kernel-name kns=SparseMlaDecode --error-exitcode 3 \
      python3 gpu/jobs/mla_support_sanitize.py 5 > "$JOB_OUT/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool rc=$?"; tail -n 8 "$JOB_OUT/sanitizer_$tool.txt"
  done
fi
