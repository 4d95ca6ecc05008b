#!/usr/bin/env bash
# limit: 330
# decode_topk after the gathered finish: GPU tests, sanitizers on small cases, benchmark + cluster sweep, one ncu.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which topk_checks.sh sources): the checks' 205 s,
# the benchmark's 110 and the ncu run's 40 came to 355 s against its 330.
source gpu/tools/topk_checks.sh
topk_checks
run timeout "$(cap 110)" python3 benchmarks/bench_topk.py --budget 70 --out "$JOB_OUT/bench_topk.json" 2>&1 \
  | tail -80
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout "$(cap 40)" "$NCU" --clock-control none --kernel-name regex:decode_topk --launch-skip 2 --launch-count 1 \
  --set full --import-source no -f -o "$JOB_OUT/c16" python3 gpu/jobs/profile_cases.py topk decode_topk_f32_token_c16 \
  1 65536 2048 > /dev/null 2>&1
"$NCU" -i "$JOB_OUT/c16.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/c16.sass.csv" 2>&1
"$NCU" -i "$JOB_OUT/c16.ncu-rep" --page details > "$JOB_OUT/c16.details.txt" 2>&1; rm -f "$JOB_OUT/c16.ncu-rep"
grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/c16.details.txt"
