# Sourced by the decode_topk jobs (topk2, topk_cand, topk_final, topk_post, mends, stage_ab, topk_row, row_loads_ab):
# decode_topk's GPU tests (every variant too) and compute-sanitizer memcheck, synccheck and racecheck on small cases,
# against the cache that SPARSE_DECODE_AOT_CACHE names (the committed one where unset). The racecheck log goes to
# $JOB_OUT/racecheck.log; its first hazards are printed. Each step's timeout is cut to what is left of the sourcing
# job's limit (gpu/tools/job_limit.sh: the five add up to 205 s, more than some of those jobs' whole limits).
source gpu/tools/job_limit.sh
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
topk_checks() {
  : "${JOB_OUT:?names the folder for the reports (e.g. JOB_OUT=\$OUT/<job>)}"
  mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
  run timeout "$(cap 60)" python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_topk_gpu.py \
    -k "not every_variant" 2>&1 | tail -30
  run timeout "$(cap 40)" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k every_variant 2>&1 \
    | tail -20
  local san
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Every tensor its own allocation under memcheck (gpu/tools/mla_sanitize.sh says why).
  run env PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$(cap 30)" "$san" --tool memcheck --print-limit 10 \
    python3 gpu/jobs/topk_sanitize.py --quick 2>&1 \
    | tail -6
  run timeout "$(cap 30)" "$san" --tool synccheck --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 \
    | tail -6
  timeout "$(cap 45)" "$san" --tool racecheck --racecheck-report hazard --print-limit 10 \
    python3 gpu/jobs/topk_sanitize.py --quick > "$JOB_OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -B2 -A12 "Error: Race" "$JOB_OUT/racecheck.log" | head -40; tail -3 "$JOB_OUT/racecheck.log"
}
