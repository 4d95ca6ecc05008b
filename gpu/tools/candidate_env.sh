# Sourced by gpu/jobs/tree_ab.sh and tree_checks.sh: the candidate tree CAND=NAME (.whl/NAME.tgz, from
# gpu/tools/candidate_tree.sh) unpacked to $cand, DeepGEMM's environment (gpu/tools/deepgemm_env.sh), the two trees'
# labels, and `in_tree DIR LABEL CMD...`: CMD run from DIR with DIR's runtime first on the path and LABEL as the
# results' commit (GIT_COMMIT: the candidate tree has no git metadata).
name=${CAND:?name the candidate: CAND=NAME for .whl/NAME.tgz}
base=$PWD
# A folder of this run's own (the sourcing job removes it on exit): a fixed /tmp/cand_tree was emptied by any other
# run that started meanwhile.
cand=$(mktemp -d /tmp/cand_tree.XXXXXX) || exit 1
trap 'rm -rf "$cand"' EXIT  # until the sourcing job sets its own (which removes $cand too)
tar -xzf ".whl/$name.tgz" -C "$cand" || { rm -rf "$cand"; exit 1; }
cat "$cand/CANDIDATE.txt"
source gpu/tools/deepgemm_env.sh
extra=; [ -d /tmp/site ] && extra=:/tmp/site  # where deepgemm_env.sh installed the carried wheel
base_rev=$(git rev-parse --short=12 HEAD 2>/dev/null || echo checkout)
cand_base=$(sed -n 's/^base //p' "$cand/CANDIDATE.txt")
cand_rev="$(cut -c1-12 <<< "$cand_base")+$name"
# The A/B compares the patch only where the rest of the host code is the checkout's: say so where it is not.
# (gpu/jobs too: tree_checks.sh runs the pack's own copies of the jobs.)
if ! git diff --quiet "$cand_base" HEAD -- 'runtime/*.py' 'kernels/*.py' 'benchmarks/*.py' 'gpu/jobs/*' 2>/dev/null; then
  echo "note: runtime/, kernels/, benchmarks/ or gpu/jobs/ differ between the candidate's base $cand_base" \
    "and the checkout's HEAD (or git cannot tell): rebuild the pack on HEAD for a clean A/B"
fi
in_tree() {
  local dir=$1 label=$2
  shift 2
  (cd "$dir" && PYTHONPATH="$dir$extra" GIT_COMMIT="$label" "$@")
}
