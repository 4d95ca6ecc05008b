#!/usr/bin/env bash
# A sparse-MLA kernel candidate as a second cache root for gpu/jobs/mla_bench_ab.sh (carry .gl): the checkout's
# HEAD with PATCH applied, its sparse_mla_decode cubins rebuilt (CuTe DSL runs here, not on the GPU machine) into
# .gl/mlacandSLOT over a copy of the committed cubins and manifests. Only the cubins travel: the GPU machine runs the
# checkout's runtime, benchmarks and GPU tests, so the patch may touch kernels/ and tests/ only (its tests run here).
# A patch to runtime/contract goes through candidate_tree.sh and tree_ab.sh (the runtime refuses a cache built
# against other contract sources). Its checks on the GPU: SPARSE_DECODE_AOT_CACHE=$PWD/.gl/mlacandSLOT
# JOB_OUT=$OUT/cand bash gpu/jobs/mla_support.sh (tests, benchmark, the three sanitizers).
#     bash gpu/tools/mla_candidate_cache.sh gpu/candidates/NAME.diff [SLOT]   (SLOT 0-9, default 1)
set -euo pipefail
patch=$(realpath "$1")
slot=${2:-1}
case $slot in [0-9]) ;; *) echo "SLOT must be one digit (mla_bench_ab.sh times .gl/mlacand[0-9]), got '$slot'" >&2; exit 2 ;; esac
repo=$PWD
if ! git -C "$repo" diff --quiet HEAD -- runtime/contract; then
  echo "the checkout's runtime/contract differs from HEAD's: commit or drop that edit first" >&2; exit 1
fi
outside=$(git -C "$repo" apply --numstat "$patch" | cut -f3 | grep -v -e '^kernels/' -e '^tests/' || true)
if [ -n "$outside" ]; then
  echo "$patch changes files outside kernels/ and tests/, which a cache root does not carry:" >&2
  echo "$outside" | sed 's/^/  /' >&2
  echo "(runtime/contract: use gpu/tools/candidate_tree.sh and gpu/jobs/tree_ab.sh)" >&2; exit 1
fi
tree=$(mktemp -d /tmp/mla_candidate.XXXXXX)
out="$repo/.gl/mlacand$slot"
# The cache is built beside its slot and moved in only once it passed: mla_bench_ab.sh times any slot with a
# manifest, and a failed build over a copy of the committed cache would be timed as the candidate.
staged="$out.partial"
trap 'git -C "$repo" worktree remove --force "$tree"; rm -rf "$staged"' EXIT
git -C "$repo" worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$patch" || { echo "$patch does not apply to HEAD" >&2; exit 1; }
rm -rf "$staged"
mkdir -p "$staged"
cp -r "$repo/cubins" "$repo/manifests" "$staged/"
(cd "$tree" && PYTHONPATH=$tree python build_kernels.py --only sparse_mla_decode --arch sm_90a --jobs 2 \
  --out "$staged" > "$staged/build.log" 2>&1) || { tail -20 "$staged/build.log"; exit 1; }
SPARSE_DECODE_AOT_CACHE=$staged PYTHONPATH=$repo python -m runtime verify --files-only --arch sm_90a | tail -1
printf 'base %s\npatch %s sha256 %s\n' "$(git -C "$repo" rev-parse HEAD)" "$(basename "$patch")" \
  "$(sha256sum "$patch" | cut -c1-16)" > "$staged/CANDIDATE.txt"
echo "sparse_mla_decode cubins the patch changed:"
for f in "$staged"/cubins/sm_90a/sparse_mla_decode_*.cubin; do
  cmp -s "$f" "$repo/cubins/sm_90a/$(basename "$f")" || echo "  $(basename "$f")"
done
rm -rf "$out"
mv "$staged" "$out"
echo "wrote $out ($(git -C "$repo" rev-parse --short HEAD) + $(basename "$patch")); carry .gl"
