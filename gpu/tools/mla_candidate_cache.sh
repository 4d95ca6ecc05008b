#!/usr/bin/env bash
# A sparse-MLA kernel candidate as a second cache root for gpu/jobs/mla_bench_ab.sh (carry .gl): the checkout's
# HEAD with PATCH applied, its sparse_mla_decode cubins rebuilt (CuTe DSL runs here, not on the GPU machine) into
# .gl/mlacandSLOT over a copy of the committed cubins and manifests. Only for a patch that leaves runtime/contract
# as it is (the runtime refuses a cache built against other contract sources; such a patch goes through
# candidate_tree.sh and tree_ab.sh). Its checks on the GPU: SPARSE_DECODE_AOT_CACHE=$PWD/.gl/mlacandSLOT
# JOB_OUT=$OUT/cand bash gpu/jobs/mla_support.sh (tests, benchmark, the three sanitizers).
#     bash gpu/tools/mla_candidate_cache.sh gpu/candidates/NAME.diff [SLOT]   (SLOT 1-9, default 1)
set -euo pipefail
patch=$(realpath "$1")
slot=${2:-1}
case $slot in [1-9]) ;; *) echo "SLOT must be 1-9 (mla_bench_ab.sh times .gl/mlacand[0-9]), got '$slot'" >&2; exit 2 ;; esac
repo=$PWD
if git -C "$repo" diff --quiet HEAD -- runtime/contract && git -C "$repo" apply --check "$patch" 2>/dev/null; then :; else
  echo "$patch does not apply to HEAD, or the checkout's runtime/contract differs from HEAD's" >&2; exit 1
fi
if git -C "$repo" apply --numstat "$patch" | grep -q 'runtime/contract/'; then
  echo "$patch changes runtime/contract: use gpu/tools/candidate_tree.sh and gpu/jobs/tree_ab.sh" >&2; exit 1
fi
tree=$(mktemp -d /tmp/mla_candidate.XXXXXX)
trap 'git -C "$repo" worktree remove --force "$tree"' EXIT
git -C "$repo" worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$patch"
out="$repo/.gl/mlacand$slot"
rm -rf "$out"
mkdir -p "$out"
cp -r "$repo/cubins" "$repo/manifests" "$out/"
(cd "$tree" && PYTHONPATH=$tree python build_kernels.py --only sparse_mla_decode --arch sm_90a --jobs 2 --out "$out" \
  > "$out/build.log" 2>&1) || { tail -20 "$out/build.log"; exit 1; }
printf 'base %s\npatch %s sha256 %s\n' "$(git -C "$repo" rev-parse HEAD)" "$(basename "$patch")" \
  "$(sha256sum "$patch" | cut -c1-16)" > "$out/CANDIDATE.txt"
SPARSE_DECODE_AOT_CACHE=$out PYTHONPATH=$repo python -m runtime verify --files-only --arch sm_90a | tail -1
echo "sparse_mla_decode cubins the patch changed:"
for f in "$out"/cubins/sm_90a/sparse_mla_decode_*.cubin; do
  cmp -s "$f" "$repo/cubins/sm_90a/$(basename "$f")" || echo "  $(basename "$f")"
done
echo "wrote $out ($(git -C "$repo" rev-parse --short HEAD) + $(basename "$patch")); carry .gl"
