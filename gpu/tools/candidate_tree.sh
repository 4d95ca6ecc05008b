#!/usr/bin/env bash
# A candidate patch made whole for a device call: the checkout's HEAD with PATCH applied and its cache rebuilt
# (CuTe DSL runs here, not on the GPU machine), packed as .whl/NAME.tgz (carry .whl); gpu/jobs/tree_ab.sh
# runs it beside the checkout. A patch that changes runtime/contract cannot be A/B'd as a cache root alone
# (SPARSE_DECODE_AOT_CACHE): the runtime refuses a cache built against other contract sources, so each side runs
# from its own tree. Prints which cubins the patch changed.
#     bash gpu/tools/candidate_tree.sh gpu/candidates/NAME.diff [NAME]
set -euo pipefail
patch=$(realpath "$1")
name=${2:-$(basename "$1" .diff)}
repo=$PWD
tree=$(mktemp -d /tmp/candidate_tree.XXXXXX)
trap 'git -C "$repo" worktree remove --force "$tree"' EXIT
git worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$patch"
(cd "$tree" && python build_kernels.py --jobs 2 > build.log 2>&1) \
  || { tail -20 "$tree/build.log"; exit 1; }
printf 'base %s\npatch %s sha256 %s\n' "$(git rev-parse HEAD)" "$(basename "$patch")" \
  "$(sha256sum "$patch" | cut -c1-16)" > "$tree/CANDIDATE.txt"
echo "changed by the patch and the rebuild:"
git -C "$tree" status --short | grep -v ' build.log$'
# The tracked files as the patch left them, and any new untracked ones; not the records (benchmarks/results).
mkdir -p .whl
(cd "$tree" && { git ls-files; git ls-files --others --exclude-standard; } | sort -u \
  | grep -v -e '^benchmarks/results/' -e '^build.log$' \
  | tar -czf "$repo/.whl/$name.tgz" -T -)
echo "wrote .whl/$name.tgz ($(du -h ".whl/$name.tgz" | cut -f1)):" \
  "$(git rev-parse --short HEAD) + $(basename "$patch")"
