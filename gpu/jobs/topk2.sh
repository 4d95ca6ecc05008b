#!/usr/bin/env bash
# limit: 330
# decode_topk after the gathered finish: GPU tests, sanitizers on small cases, benchmark + cluster sweep, one ncu.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
run() { echo "+ $*"; "$@"; echo "rc=$?"; }
run timeout 60 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k "not every_variant" 2>&1 | tail -30
run timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_topk_gpu.py -k every_variant 2>&1 | tail -20
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run timeout 30 "$SAN" --tool memcheck --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -6
run timeout 30 "$SAN" --tool synccheck --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -6
run timeout 45 "$SAN" --tool racecheck --racecheck-report hazard --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | grep -v "^========= *$" | tail -40
run timeout 110 python3 benchmarks/bench_topk.py --budget 70 --out "$JOB_OUT/bench_topk.json" 2>&1 | tail -80
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 40 "$NCU" --clock-control none --kernel-name regex:decode_topk --launch-skip 2 --launch-count 1 --set full \
  --import-source no -f -o "$JOB_OUT/c16" python3 gpu/jobs/profile_cases.py topk decode_topk_f32_token_c16 1 65536 2048 > /dev/null 2>&1
"$NCU" -i "$JOB_OUT/c16.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/c16.sass.csv" 2>&1
"$NCU" -i "$JOB_OUT/c16.ncu-rep" --page details > "$JOB_OUT/c16.details.txt" 2>&1; rm -f "$JOB_OUT/c16.ncu-rep"
grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/c16.details.txt"
