#!/usr/bin/env bash
# limit: 560
# What the forty-seventh to fifty-third sessions' checks cost on the host, against the forty-sixth session's final
# runtime (fd8dccc, the last one timed: carried as .whl/runtime_s46.tgz, `git archive fd8dccc runtime | gzip -n`).
# Both runtimes read this checkout's cubins and manifests (the old loader reads today's manifests).
#   1. the ops' eager host time, the two runtimes side by side in one process (gpu/jobs/host_ab.py);
#   2. runtime.load() in fresh processes and the eager launch against a bare cuLaunchKernelEx
#      (benchmarks/bench_runtime.py), three rounds alternating old and new, each tree importing its own runtime;
#   3. the plain eager host time of the ops beside their launches on this tree (benchmarks/bench_host.py).
# Carry .whl (DeepGEMM wheel for the indexer step, the old runtime). Results: $JOB_OUT (or $OUT).
set -uo pipefail
OUTDIR=${JOB_OUT:-$OUT}
mkdir -p "$OUTDIR"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONUNBUFFERED=1 SPARSE_DECODE_AOT_CACHE=$PWD PYTHONPATH=$PWD
source gpu/tools/deepgemm_env.sh  # the carried DeepGEMM wheel into /tmp/site, its libraries, its JIT cache
# A step's timeout: its own, or what is left of LIMIT (the whole job's seconds, inside the device call's 600: its limit
# line unless set) less 10 s to pack, at least 1 (gpu/tools/job_limit.sh's cap). The steps' own timeouts sum to
# 1070 s (200, six rounds of 120, 150): a hang ran past the call's 600 s and lost the rounds' archive and step 3.
source gpu/tools/job_limit.sh
# Folders of this call's own, removed at the end with the checkout's ab/ (host_ab.py's two trees): the fixed
# /tmp/load_ab kept an earlier call's rounds on a warm machine, so a round that wrote nothing this time was read and
# packed from the earlier call's JSON.
OLD=$(mktemp -d /tmp/ab_s46.XXXXXX) load=$(mktemp -d /tmp/load_ab.XXXXXX)
trap 'rm -rf "$OLD" "$load" ab' EXIT
rm -rf ab && mkdir -p "$OLD/benchmarks" ab/old ab/new
tar -xzf .whl/runtime_s46.tgz -C "$OLD" || { echo "no .whl/runtime_s46.tgz (carry .whl)"; exit 1; }
cp benchmarks/*.py "$OLD/benchmarks/"  # the same benchmark code for both trees; only runtime/ differs
cp -r "$OLD/runtime" ab/old/ && cp -r runtime ab/new/
python3 -c "
from benchmarks.common import source_digest; import subprocess
print('tree', subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True).stdout.strip(),
      'host code digest', source_digest())" | tee "$OUTDIR/tree.txt"
sha256sum manifests/*.json | tee -a "$OUTDIR/tree.txt"

echo "=== 1. eager host time, old and new runtime in one process (${SECONDS}s)"
timeout "$(cap 200)" python3 gpu/jobs/host_ab.py "$OUTDIR/host_ab.json" --blocks 61 2>&1 | tail -8

echo "=== 2. load and eager launch, three alternating rounds (${SECONDS}s)"
for round in 1 2 3; do
  (cd "$OLD" && PYTHONPATH=$OLD:/tmp/site timeout "$(cap 120)" python3 benchmarks/bench_runtime.py \
     "$load/load_ab_old_$round.json" --runs 7 --profile-runs 0 > "$load/old_$round.log" 2>&1)
  echo "old round $round rc=$? (${SECONDS}s)"
  timeout "$(cap 120)" python3 benchmarks/bench_runtime.py "$load/load_ab_new_$round.json" --runs 7 --profile-runs 0 \
    > "$load/new_$round.log" 2>&1
  echo "new round $round rc=$? (${SECONDS}s)"
done
python3 - "$load" <<'EOF'
import json, glob, sys
for path in sorted(glob.glob(sys.argv[1] + "/load_ab_*.json")):
    d = json.load(open(path))
    c, launch = d.get("cold_start", {}), d.get("launch_overhead", {})
    fresh, pre = c.get("load_including_cuda_python_import", {}), c.get("load_cuda_python_preimported", {})
    print(path.rsplit("/", 1)[1], "load %.1f ms (preimported %.1f, import runtime %.1f)" % (
        fresh.get("load_ms_median", -1), pre.get("load_ms_median", -1), pre.get("import_runtime_ms_median", -1)),
        "launch %.2f vs bare %.2f us" % (launch.get("runtime_launch_us", -1), launch.get("bare_cuLaunchKernelEx_us", -1)))
EOF
tar czf "$OUTDIR/load_ab.tgz" -C "$load" .

echo "=== 3. plain eager host time on this tree (${SECONDS}s)"
timeout "$(cap 150)" python3 benchmarks/bench_host.py --out "$OUTDIR/host.json" 2>&1 | tail -12
echo "=== took ${SECONDS}s"
