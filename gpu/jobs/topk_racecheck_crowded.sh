#!/usr/bin/env bash
# limit: 560
# decode_topk's crowded-warp sanitizer cases under racecheck alone (gpu/jobs/topk_sanitize.py --crowded=only: the
# 2- and 4-CTA twins past their table's tiles, on rows that crowd one warp's list segment, FP32 and BF16, k 1024 and
# 2048; all-equal rows on the 2-CTA twin), one process a case side by side, each with the whole call: racecheck did
# not finish the first of them in 240 s on the H200 (fifty-seventh session), so verify_all.sh's racecheck shards
# leave them out. memcheck and synccheck take them in verify_all.sh. Reports: $JOB_OUT/topk_racecheck_crowded.tgz.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
archive_dir=${JOB_OUT:?}
mkdir -p "$archive_dir"  # JOB_OUT=$OUT/<job>, a folder not made yet: every pack failed and nothing came back
work=$(mktemp -d /tmp/racecheck_crowded.XXXXXX)
trap 'rm -rf "$work"' EXIT  # the archive holds it all: the folder was left in /tmp, one more each call
JOB_OUT=$work TOOL=racecheck SHARDS=4 CROWDED=only SECONDS_EACH=$((${LIMIT:-560} - 20 - SECONDS)) \
  bash gpu/jobs/topk_sanitize_full.sh | tee "$work/summary.txt"
tar czf "$archive_dir/topk_racecheck_crowded.tgz" -C "$work" .
