# Sourced by gpu/jobs/topk_sanitize_full.sh and gpu/tools/mla_sanitize.sh: their one test of a finished report.
# report_clean FILE TOOL WHAT: the report FILE of compute-sanitizer's TOOL shows a summary at 0 errors, the job's own
# "N/N WHAT" count with N at least 1 (printed only once every case or launch ran: a run cut short by its timeout has
# none; a shard left no case, when there are more shards than cases, prints 0/0 and ran nothing), and the
# "rc=" line that the caller appended at 0. --error-exitcode also fires on racecheck's warnings (benign ones are
# explained in the README), so a clean racecheck report may end at 3; any other rc (a crash after the last case, say:
# 139, with the summary at 0 errors) is no clean report. No summary in it may count errors: a report holding several
# (a child process's besides the parent's) passed on its one at 0 errors.
report_clean() {
  local f=$1 tool=$2 what=$3 ok_rc="rc=0"
  [ "$tool" = racecheck ] && ok_rc="rc=(0|3)"
  grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: .*\(0 errors" "$f" && grep -qE "^([1-9][0-9]*)/\1 $what" "$f" \
    && grep -qxE "$ok_rc" "$f" && ! grep -qE "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: .*\([1-9][0-9]* errors" "$f"
}
