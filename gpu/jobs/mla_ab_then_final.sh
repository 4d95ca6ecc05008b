#!/usr/bin/env bash
# limit: 330
# One device call for a sparse_mla_decode candidate round: mla_bench_ab.sh (tests + KV-rotated A/B of the committed
# cache and every .gl/mlacand[0-9]), then, only for the candidate whose median at width 640 T = 12 beats the committed
# cache's by more than MARGIN us (default 0.03), the full benchmark (Triton sweep), every GPU test and the three
# sanitizers on its cache. Candidate caches need manifests for both archs (the loader tests read sm_100a's).
# Output under $JOB_OUT: ab.log, and for a winner bench_sparse_mla.{json,md}, tests.log, san.log, sanitizer_*.txt.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each part given what is left of the limit as its own (gpu/tools/job_limit.sh): the A/B alone (420 s, its limit) was
# more than the job's 330, and a winner's benchmark, GPU tests and sanitizers (320 + 300 + 90) came after it.
source gpu/tools/job_limit.sh
LIMIT=$(cap 420) ROUNDS=${ROUNDS:-3} MLA_BENCH_ARGS=${MLA_BENCH_ARGS:---widths 640 --tokens 1 12 48} \
  bash gpu/jobs/mla_bench_ab.sh > "$JOB_OUT/ab.log" 2>&1
grep -E "passed|failed|== bench|^w= 640 T= 12" "$JOB_OUT/ab.log"
best=$(python3 - "$JOB_OUT/ab.log" "${MARGIN:-0.03}" <<'PY'
import re, statistics, sys
times, cur = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"== bench round \d+: (\S+)", line)
    if m:
        cur = m.group(1)
        continue
    m = re.match(r"w=\s*640 T=\s*12 kernel\s+([\d.]+)", line)
    if m and cur:
        times.setdefault(cur, []).append(float(m.group(1)))
med = {c: statistics.median(v) for c, v in times.items()}
base = next((v for c, v in med.items() if "/.gl/" not in c), None)
cands = {c: v for c, v in med.items() if "/.gl/" in c}
print({c.split("/")[-1]: v for c, v in med.items()}, file=sys.stderr)
if base is not None and cands:
    c, v = min(cands.items(), key=lambda kv: kv[1])
    if v < base - float(sys.argv[2]):
        print(c)
PY
)
echo "winner: ${best:-none}"
[ -n "$best" ] || exit 0
SPARSE_DECODE_AOT_CACHE=$best JOB_OUT=$JOB_OUT LIMIT=$(cap 320) bash gpu/jobs/mla_bench.sh > "$JOB_OUT/bench.log" 2>&1
grep -E "^w=|Target" "$JOB_OUT/bench.log"
SPARSE_DECODE_AOT_CACHE=$best LIMIT=$(cap 300) bash gpu/jobs/all_gpu_tests.sh > "$JOB_OUT/tests.log" 2>&1
tail -3 "$JOB_OUT/tests.log"
SPARSE_DECODE_AOT_CACHE=$best JOB_OUT=$JOB_OUT bash gpu/tools/mla_sanitize.sh "$(cap 90)" > "$JOB_OUT/san.log" 2>&1
grep SUMMARY "$JOB_OUT/san.log"
rm -f "$JOB_OUT/sanitizer_memcheck.txt"
