#!/usr/bin/env bash
# limit: 300
# sparse_mla_decode support (issue 3), final mode: the AOT kernel and the Triton peer against the
# reference (tests/test_sparse_mla_gpu.py), the benchmark (JSON + table to $JOB_OUT), then
# compute-sanitizer memcheck/racecheck/synccheck on small launches of both widths with and without
# sinks (the three tools in parallel). Each step runs under its own timeout, cut to the time left
# (this limit or ROUND_CAP, whichever is smaller), so a hang or a short round costs later steps only.
set -uo pipefail  # a step's failure is its status, not its filter's
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_REQUIRE_GPU=1
# 300, not 170: on a machine started for the call, Triton compiles every swept config cold, and the eighty-first
# session's run (H100) lost its Triton tests at 45 s, its benchmark at 75 s (after width 640) and its sanitizers.
limit=${LIMIT:-300}  # run_all.sh passes what is left of the call
[ -n "${ROUND_CAP:-}" ] && [ "$ROUND_CAP" -lt "$limit" ] && limit=$ROUND_CAP
end=$((SECONDS + limit - 6))
left() { local l=$((end - SECONDS)); [ "$l" -gt "$1" ] && l=$1; echo $(( l > 0 ? l : 1 )); }
PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider -rs"
FILTER='^    \|^E  *\[\|^E  *+  *where\|^[a-z_]* = tensor\|^  *\[\|device=.cuda'
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

echo "== AOT kernel vs reference"
failed=()
# (grep -v's own status, 1 where every line was filtered, is not the step's: the pytest status is taken alone)
timeout "$(left 40)" $PYTEST tests/test_sparse_mla_gpu.py -k "not triton" --timeout 30 2>&1 \
  | tee "$JOB_OUT/pytest_kernel.txt" | { grep -v "$FILTER" || true; } | tail -n 30 || failed+=("kernel tests")

echo "== Triton peer vs reference (every swept config too; compiles them for the benchmark)"
timeout "$(left 120)" $PYTEST tests/test_sparse_mla_gpu.py -k "triton" 2>&1 \
  | tee "$JOB_OUT/pytest_triton.txt" | { grep -v "$FILTER" || true; } | tail -n 20 || failed+=("Triton peer tests")

echo "== benchmark"
timeout "$(left 90)" python3 benchmarks/bench_sparse_mla.py --out "$JOB_OUT/bench_sparse_mla.json"
rc=$?; echo "benchmark rc=$rc"; [ $rc -eq 0 ] || failed+=("benchmark")

bash gpu/tools/mla_sanitize.sh "$(left 45)" || failed+=("sanitizers")
verdict="mla_support: every step passed"; [ ${#failed[@]} -eq 0 ] || verdict="mla_support: FAILED: ${failed[*]}"
echo "$verdict"
[ ${#failed[@]} -eq 0 ]
