"""The GPU jobs' sanitizer verdicts, on the CPU: gpu/jobs/topk_sanitize_full.sh and gpu/tools/mla_sanitize.sh run
against a fake compute-sanitizer that prints crafted reports and exits with crafted codes, and
gpu/jobs/mla_support_sanitize.py with its launches stubbed. A verdict may call a run clean only where it finished
with its summary at 0 errors and its own count of what ran."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

# FAKE_<shard or tool>: clean (the run's count and its summary at 0 errors; racecheck exits 3 on its warnings, as
# --error-exitcode makes it), crash (the same, then a crash: 139), nonfinite (an MLA launch's output not finite: the
# script's count says so and it exits 1), hang (past the timeout; the summary printed on SIGTERM), empty (a shard
# given no case, as one past the case count is: "0/0", a clean summary, rc 0).
FAKE = r"""#!/usr/bin/env bash
tool=$2
key=$(printf '%s\n' "$@" | sed -n 's/^--shard=\([0-9]*\)\/.*/\1/p'); [ -n "$key" ] || key=$tool
mode=$(eval echo "\${FAKE_$key:-clean}")
summary() {
  if [ "$tool" = racecheck ]; then echo "========= RACECHECK SUMMARY: 4 hazards displayed (0 errors, 9 warnings)"
  else echo "========= ERROR SUMMARY: 0 errors"; fi
}
echo "========= COMPUTE-SANITIZER"
if [ "${FAKE_JOB:-}" = topk ] || [[ "$*" == *topk_sanitize* ]]; then
  echo "case ok: decode_topk randn width 40003 k=512"; count="6/6 cases match"
else
  [ "$mode" = nonfinite ] && echo "width 128 sinks True: T=5 finite=False"
  for i in 1 2 3 4 5 6 7 8; do echo "edge width 640 sinks False pools (0, 20000): finite=True"; done
  count="16/16 launches finite"; [ "$mode" = nonfinite ] && count="15/16 launches finite"
fi
[ "$mode" = empty ] && count="0/0 ${count#* }"
case $mode in
  clean|empty) echo "$count"; summary; [ "$tool" = racecheck ] && exit 3; exit 0;;
  crash) echo "$count"; echo "========= Error: process didn't terminate successfully"; summary; exit 139;;
  nonfinite) echo "$count"; echo "========= Target application returned an error"; summary; exit 1;;
  hang) trap 'summary; exit 143' TERM; sleep 60 & wait;;
esac
"""


@pytest.fixture
def fake_sanitizer(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()

    def run(script: str, *args: str, **env: str) -> str:
        full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JOB_OUT": str(out),
                    "COMPUTE_SANITIZER": str(fake), "PYTHONPATH": str(ROOT), **env}
        proc = subprocess.run(["bash", script, *args], check=False, cwd=ROOT, env=full_env, capture_output=True,
                              text=True, timeout=60)
        run.rc = proc.returncode  # the script's exit status, for the tests that hold it too
        return proc.stdout + proc.stderr

    return run


def _verdicts(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("verdict:")]


def test_a_topk_shard_that_crashed_after_its_cases_is_not_clean(fake_sanitizer):
    """Its cases matched and its summary said 0 errors, but it exited 139: counted clean before."""
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="memcheck", SHARDS="3", SECONDS_EACH="2",
                            FAKE_JOB="topk", FAKE_1="crash", FAKE_2="hang")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 1 of 3 shards clean"), output
    assert "incomplete: 1 cases ran" in output
    assert fake_sanitizer.rc == 1, output  # it exited with the verdict's echo, 0: run_all.sh's summary said rc=0


def test_a_topk_shard_that_ran_no_case_is_not_clean(fake_sanitizer):
    """More shards than cases leaves a shard nothing to run: its "0/0 cases match" and clean summary counted clean."""
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="memcheck", SHARDS="2", SECONDS_EACH="5",
                            FAKE_JOB="topk", FAKE_1="empty")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 1 of 2 shards clean"), output
    assert fake_sanitizer.rc == 1, output


def test_a_clean_racecheck_shard_may_exit_3_on_its_warnings(fake_sanitizer):
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="racecheck", SHARDS="2", SECONDS_EACH="5",
                            FAKE_JOB="topk")
    (verdict,) = _verdicts(output)
    assert verdict.startswith("verdict: 2 of 2 shards clean") and "crowded cases: skip" in verdict, output
    assert fake_sanitizer.rc == 0, output


@pytest.mark.parametrize("env, each", [({"SECONDS_EACH": "5"}, 5), ({"SECONDS_EACH": "50", "LIMIT": "30"}, 10),
                                       ({"LIMIT": "470"}, 400), ({"LIMIT": "15"}, 1)])
def test_topk_shards_end_within_a_cut_limit(fake_sanitizer, env, each):
    """The shards' timeout (SECONDS_EACH, default 400) ignored a LIMIT that run_all.sh cut: a job given less ran its
    shards past it and was killed before its verdict. Now the least of the two, less 20 s for the verdict."""
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="memcheck", SHARDS="2", FAKE_JOB="topk", **env)
    assert f"memcheck: each shard's timeout {each}s" in output, output


@pytest.mark.parametrize("fakes, bad_tools", [({}, 0), ({"FAKE_1": "crash"}, 3)])
def test_all_three_topk_tools_exit_with_the_count_of_tools_not_clean(fake_sanitizer, fakes, bad_tools):
    """TOOL=all exited 0 whatever its tools found (FAKE_1 crashes shard 1 of each tool)."""
    output = fake_sanitizer("gpu/jobs/topk_sanitize_full.sh", TOOL="all", SECONDS_EACH="5", FAKE_JOB="topk", **fakes)
    assert len(_verdicts(output)) == 3 and fake_sanitizer.rc == bad_tools, output


@pytest.mark.parametrize("mode", ["nonfinite", "hang", "crash"])
def test_the_mla_sanitizers_verdict_reads_each_report_whole(fake_sanitizer, mode):
    """A launch's non-finite output in a report's first lines, a tool cut short by its timeout (the summary printed on
    SIGTERM), a crash after the count: the tails printed before showed 0 errors and nothing else; no verdict was
    printed."""
    output = fake_sanitizer("gpu/tools/mla_sanitize.sh", "2", FAKE_memcheck=mode)
    assert _verdicts(output) == ["verdict: 2 of 3 tools clean (0 sanitizer errors, every launch finite)"], output
    clean = fake_sanitizer("gpu/tools/mla_sanitize.sh", "5")
    assert _verdicts(clean) == ["verdict: 3 of 3 tools clean (0 sanitizer errors, every launch finite)"], clean


def test_the_mla_sanitizer_script_counts_its_launches_and_fails_on_a_non_finite_one(monkeypatch, capsys):
    """gpu/jobs/mla_support_sanitize.py printed finite=False for a launch and exited 0, so no sanitizer's summary or
    exit code said so. Its launches stubbed: the first one's output holds a NaN."""
    calls = []

    def decode(*args, **kwargs):
        calls.append(1)
        return torch.full((2, 3), float("nan") if len(calls) == 1 else 0.5)

    cases = types.ModuleType("tests.test_sparse_mla_gpu")
    cases.BMM1_SCALE = cases.BMM2_SCALE = 1.0
    cases.COMP_ROWS, cases.SWA_ROWS = 20000, 3000
    cases.make_case = lambda *args, **kwargs: ((), None)
    cases.make_edge_case = lambda *args, **kwargs: ((), None)
    ops = types.ModuleType("runtime.sparse_mla")
    ops.sparse_mla_decode = decode
    ops.supports_sparse_mla = lambda *args, **kwargs: True
    monkeypatch.setitem(sys.modules, "tests.test_sparse_mla_gpu", cases)
    monkeypatch.setitem(sys.modules, "runtime.sparse_mla", ops)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["mla_support_sanitize.py", "5"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "gpu" / "jobs" / "mla_support_sanitize.py"), run_name="__main__")
    assert exit_info.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(calls) == 16 and lines[0].endswith("finite=False") and lines[-1] == "15/16 launches finite"


# Dry runs of whole jobs, as a session calls them on the GPU machine: from a scratch checkout (gpu/ and tests/ copied,
# the rest linked), `JOB_OUT=$OUT/<job> bash gpu/jobs/<job>.sh` with no PYTHONPATH, every GPU-side tool a stub first on
# PATH. The stub python3 runs nothing: it prints, exits with FAKE_PYTEST_RC / FAKE_VERIFY_RC (pytest, runtime verify),
# hangs where FAKE_HANG matches its arguments, crashes before writing where FAKE_NO_WRITE does, writes the JSON a
# script is given (--out or a *.json argument: benchmarks/ make its folder, gpu/jobs/ scripts do not, as the real ones),
# fails as Python would where a script that does not put the checkout on sys.path itself runs without it on
# PYTHONPATH, and writes nothing outside the test's folder but into a job's own temporary folder (/tmp/NAME.XXXXXX).
STUB_PYTHON = r"""#!/usr/bin/env bash
write() {  # SCRIPT PATH
  [[ -n "${FAKE_NO_WRITE:-}" && "$1" == *$FAKE_NO_WRITE* ]] && { echo "Traceback: crashed before writing $2"; exit 1; }
  case "$2" in
    "$DRY_ROOT"/*|/tmp/*/*) ;;
    *) echo "PermissionError: a dry run writes into its folder or a job's temporary one only: '$2'"; exit 1;;
  esac
  case "$1" in benchmarks/*) mkdir -p "$(dirname "$2")";; esac
  { echo '{}' > "$2"; } 2>/dev/null || { echo "FileNotFoundError: [Errno 2] No such file or directory: '$2'"; exit 1; }
}
[[ -n "${FAKE_HANG:-}" && "$*" == *$FAKE_HANG* ]] && exec sleep 30
case "$1" in
  -P) shift; exec "$0" "$@";;
  -) cat > /dev/null; echo "stub stdin script"; exit 0;;
  -c) case "$2" in
        *sysconfig*|*"import deep_gemm"*) exec "$DRY_PYTHON" "$@";;
        *device_count*) echo "${FAKE_GPUS:-1}"; exit 0;;
      esac
      p=$(grep -o "open('[^']*', 'w')" <<< "$2" | head -1 | cut -d"'" -f2)
      [ -z "$p" ] || write -c "$p"
      echo "stub -c"; exit 0;;
  -m) case "$2" in
        pytest) echo "212 passed in 1.00s"; exit "${FAKE_PYTEST_RC:-0}";;
        runtime) echo "runtime verify: ok"; exit "${FAKE_VERIFY_RC:-0}";;
      esac; exit 0;;
esac
script=$1; shift
if ! grep -q "sys.path.insert" "$script" 2>/dev/null && [[ ":${PYTHONPATH:-}:" != *":$PWD:"* ]]; then
  echo "ModuleNotFoundError: No module named 'benchmarks' ($script run without the checkout on PYTHONPATH)"; exit 1
fi
prev=
for a in "$@"; do
  if [ "$prev" = --out ] || [[ "$a" == *.json || "$a" == *.jsonl ]]; then write "$script" "$a"; fi
  prev=$a
done
echo "stub $script"
"""
STUBS = {
    "python3": STUB_PYTHON,
    "compute-sanitizer": FAKE,
    "ncu": 'prev=; for a in "$@"; do [ "$prev" = -o ] && { : > "$a.ncu-rep" || exit 1; }; prev=$a; done\n'
           'echo "Duration 1 us"\n',
    "nvidia-smi": 'echo "${FAKE_GPU_NAME:-NVIDIA H100 80GB HBM3}, 570.00, 1980 MHz, 2619 MHz"\n',
    "nvcc": "exit 0\n",  # compiles nothing: the binary it names is then missing, its output's tee still opens
    "torchrun": "exit 0\n",
    "pip": "exit 0\n",
}
JOBS = sorted(p.stem for p in (ROOT / "gpu" / "jobs").glob("*.sh"))
JOB_TEMP = ("verify_all.", "host_changes.", "tree_ab.", "tree_checks.", "racecheck_crowded.", "indexer_steps.",
            "indexer_job", "load_ab", "ab_s46", "cand_tree", "gpu_out")  # the jobs' temporary folders and files in /tmp
MISSING_FOLDER = ("No such file or directory", "Cannot open", "cannot open")


class DryRun:
    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.repo = tmp_path / "repo"
        self.repo.mkdir()
        for name in ("gpu", "tests"):
            shutil.copytree(ROOT / name, self.repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("runtime", "benchmarks", "manifests", "cubins", "kernels"):
            (self.repo / name).symlink_to(ROOT / name)
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name, text in STUBS.items():
            stub = self.bin / name
            stub.write_text(text if text.startswith("#!") else "#!/usr/bin/env bash\n" + text)
            stub.chmod(0o755)
        self.out = tmp_path / "OUT"
        self.out.mkdir()

    def candidate(self, name: str = "cand") -> None:
        """A candidate pack as gpu/tools/candidate_tree.sh leaves it: .whl/NAME.tgz, the tree and CANDIDATE.txt."""
        tree = self.root / "cand_src"
        shutil.copytree(self.repo / "gpu", tree / "gpu")
        (tree / "CANDIDATE.txt").write_text("base 0123456789abcdef0123456789abcdef01234567\npatch cand.diff\n")
        (self.repo / ".whl").mkdir(exist_ok=True)
        subprocess.run(["tar", "czf", str(self.repo / ".whl" / f"{name}.tgz"), "-C", str(tree), "."], check=True)

    def __call__(self, script: str, *args: str, job_out: str | None = "unmade", timeout: float = 60,
                 **env: str) -> tuple[int, str]:
        """(exit status, stdout + stderr) of `bash SCRIPT ARGS` from the scratch checkout; job_out: "unmade"
        ($OUT/<job>, not made yet), "made" (made, as run_all.sh does) or None (unset)."""
        full_env = {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/"),
                    "OUT": str(self.out), "DRY_ROOT": str(self.root), "DRY_PYTHON": sys.executable,
                    "COMPUTE_SANITIZER": str(self.bin / "compute-sanitizer"), **env}
        if job_out is not None:
            folder = self.out / Path(script).stem
            if job_out == "made":
                folder.mkdir()
            full_env["JOB_OUT"] = str(folder)
        proc = subprocess.run(["bash", script, *args], check=False, cwd=self.repo, env=full_env,
                              capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr


def _archived(archive: Path) -> list[str]:
    """The names a .tgz holds."""
    return subprocess.run(["tar", "tzf", str(archive)], check=True, capture_output=True, text=True).stdout.split()


@pytest.fixture
def dry_run(tmp_path):
    return DryRun(tmp_path)


@pytest.mark.parametrize("job", JOBS)
def test_a_job_called_as_a_session_calls_it_writes_its_reports(dry_run, job):
    """`JOB_OUT=$OUT/<job> bash gpu/jobs/<job>.sh` from the checkout, no PYTHONPATH: indexer.sh's first step failed to
    write into a JOB_OUT folder nothing had made (seventy-first session), and so did every other job's first write (a
    report, tee's log, the archive of verify_all.sh, tree_ab.sh and the other long jobs: nothing came back); jobs that
    did not export PYTHONPATH (run_all.sh does) ran their scripts without the checkout's packages."""
    dry_run.candidate()
    before = set(os.listdir("/tmp"))
    rc, output = dry_run(f"gpu/jobs/{job}.sh", CAND="cand", OLD_RUNTIME=".whl/cand.tgz")
    left_behind = [name for name in set(os.listdir("/tmp")) - before if name.startswith(JOB_TEMP)]
    assert not left_behind, left_behind  # the jobs' own folders in /tmp, one more each call on a warm machine
    job_out = str(dry_run.out / job)
    missing = [line for line in output.splitlines() if job_out in line and any(m in line for m in MISSING_FOLDER)]
    assert not missing, output
    assert "ModuleNotFoundError" not in output, output
    if job == "all_gpu_tests":  # a log tee could not open made pipefail fail both steps that passed
        assert rc == 0 and "runtime verify rc=0, pytest rc=0" in output, output


# Jobs that run without JOB_OUT: all_gpu_tests.sh (its logs to /tmp), host_load_ab.sh ($OUT), mla_cand.sh (JOB_OUT only
# with CAND_BENCH), indexer_tp.sh on a machine of one GPU (nothing run).
JOB_OUT_OPTIONAL = {"all_gpu_tests", "host_load_ab", "mla_cand", "indexer_tp"}


@pytest.mark.parametrize("job", [j for j in JOBS if "JOB_OUT" in (ROOT / "gpu" / "jobs" / f"{j}.sh").read_text()
                                 and j not in JOB_OUT_OPTIONAL])
def test_a_job_without_JOB_OUT_stops_before_it_runs_anything(dry_run, job):
    """Without JOB_OUT, jobs whose only write into it sat in a pipeline (set -u ends that subshell alone) ran every step
    and exited 0 with no report; those without set -u wrote /runtime.json."""
    dry_run.candidate()
    rc, output = dry_run(f"gpu/jobs/{job}.sh", job_out=None, CAND="cand", OLD_RUNTIME=".whl/cand.tgz")
    assert rc != 0 and "JOB_OUT" in output.splitlines()[0], output


def test_benchmarks_both_sends_back_this_calls_reports_and_fails_where_a_part_did(dry_run):
    """On a warm machine the fixed /tmp/indexer_job kept the previous call's reports: an indexer benchmark that wrote
    nothing sent the previous bench_indexer.json back as this call's. The job exited 0 whatever its parts did (the
    indexer job's status was tail's, the sparse-MLA benchmark's the echo's)."""
    rc, output = dry_run("gpu/jobs/benchmarks_both.sh")
    job_out = dry_run.out / "benchmarks_both"
    assert rc == 0 and (job_out / "bench_indexer.json").exists(), output
    shutil.rmtree(job_out)
    rc, output = dry_run("gpu/jobs/benchmarks_both.sh", FAKE_NO_WRITE="bench_indexer")
    assert rc != 0 and "indexer job rc=1" in output, output
    assert not (job_out / "bench_indexer.json").exists(), output
    archived = _archived(job_out / "indexer_job.tgz")
    assert "./bench_indexer.json" not in archived and "./indexer.log" in archived, archived
    shutil.rmtree(job_out)
    rc, output = dry_run("gpu/jobs/benchmarks_both.sh", FAKE_NO_WRITE="bench_sparse_mla")
    assert rc != 0 and "sparse_mla_decode benchmark rc=1, indexer job rc=0" in output, output


@pytest.mark.parametrize("failing, env", [
    ("runtime verify", {"FAKE_VERIFY_RC": "1"}),
    ("GPU tests", {"FAKE_PYTEST_RC": "1"}),
    ("decode_topk sanitizers", {"FAKE_1": "crash"}),
    (None, {}),
])
def test_tree_checks_names_what_failed_and_exits_1(dry_run, failing, env):
    """tree_checks.sh exited with its last tar's 0 and printed no verdict: a failed runtime verify, GPU test or
    sanitizer shard read as a pass."""
    dry_run.candidate()
    rc, output = dry_run("gpu/jobs/tree_checks.sh", CAND="cand", **env)
    verdict = output.splitlines()[-1]
    if failing is None:
        assert rc == 0 and verdict == "tree_checks: every check passed", output
    else:
        assert rc == 1 and verdict == f"tree_checks: FAILED: {failing}", output
    archived = _archived(dry_run.out / "tree_checks" / "tree_checks.tgz")
    assert "./verdict.txt" in archived, archived


@pytest.mark.parametrize("failing, env", [
    ("GPU tests indexer", {"FAKE_PYTEST_RC": "1"}),  # the indexer job runs its GPU tests too
    ("pool_rows memcheck", {"FAKE_memcheck": "crash"}),
    ("bench_pool_rows", {"FAKE_NO_WRITE": "bench_pool_rows"}),
    (None, {}),
])
def test_host_changes_names_what_failed_and_packs_every_step(dry_run, failing, env):
    """host_changes.sh (every GPU test, topk_pool_rows' memcheck, the indexer job, its cost): its verdict names the
    steps that failed, and its one archive holds each step's reports (a call brings back 8 files, the steps write
    more)."""
    rc, output = dry_run("gpu/jobs/host_changes.sh", **env)
    verdict = output.splitlines()[-1]
    if failing is None:
        assert rc == 0 and verdict.startswith("host_changes: every step passed"), output
    else:
        assert rc == 1 and verdict.startswith(f"host_changes: FAILED: {failing}"), output
    archived = _archived(dry_run.out / "host_changes" / "host_changes.tgz")
    for name in ("gpu.txt", "all_gpu_tests.log", "tests/tests_digest.txt", "pool_rows_memcheck.log", "indexer.log",
                 "bench_pool_rows.log", "verdict.txt"):
        assert f"./{name}" in archived, (name, archived)
    assert ("./bench_pool_rows.json" in archived) == (failing != "bench_pool_rows"), archived
    assert os.listdir(dry_run.out / "host_changes") == ["host_changes.tgz"]


@pytest.mark.parametrize("memcheck", ["clean", "crash"])
def test_verify_all_runs_topk_pool_rows_memcheck_and_names_its_failure(dry_run, memcheck):
    """The whole pass holds topk_pool_rows' GPU tests under memcheck (gpu/tools/pool_rows_memcheck.sh, beside the
    other sanitizers); a crash there is named in the verdict, with sparse MLA's memcheck, which the fake fails too."""
    rc, output = dry_run("gpu/jobs/verify_all.sh", FAKE_memcheck=memcheck)
    verdict = output.splitlines()[-1]
    if memcheck == "clean":
        assert rc == 0 and verdict == "verify_all: every phase passed", output
    else:
        assert rc == 1 and "topk_pool_rows memcheck" in verdict and "sparse MLA sanitizers" in verdict, output
    assert "./pool_rows_memcheck.txt" in _archived(dry_run.out / "verify_all" / "verify_all.tgz")


def _run_all(dry_run, jobs: dict[str, str], cut_at: float, **env: str) -> tuple[str, list[str]]:
    """gpu/run_all.sh on fake jobs (name: body, its first lines a `# limit:`), its whole process group killed at
    cut_at seconds as a device call's end kills it; (summary.txt, the names results.tar.gz holds), empty where absent."""
    for name, body in jobs.items():
        (dry_run.repo / "gpu" / "jobs" / f"{name}.sh").write_text(f"#!/usr/bin/env bash\n{body}\n")
    full_env = {"PATH": f"{dry_run.bin}{os.pathsep}{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/"),
                "OUT": str(dry_run.out), "DRY_ROOT": str(dry_run.root), "DRY_PYTHON": sys.executable, **env}
    with open(dry_run.root / "run_all.log", "w") as log:
        proc = subprocess.Popen(["bash", "gpu/run_all.sh", *jobs], cwd=dry_run.repo, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        killed = False
        try:
            proc.wait(timeout=cut_at)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            killed = True
    # run_all.sh's stage of its own (a fixed /tmp/gpu_out was emptied by any run that started meanwhile), which its
    # exit trap removes, unless the SIGKILL above ended it
    stage = next((Path(line.split(" ", 1)[1]) for line in (dry_run.root / "run_all.log").read_text().splitlines()
                  if line.startswith("stage /tmp/gpu_out.")), None)
    assert stage is not None, (dry_run.root / "run_all.log").read_text()
    assert killed or not stage.exists(), stage
    shutil.rmtree(stage, ignore_errors=True)
    summary = dry_run.out / "summary.txt"
    archive = dry_run.out / "results.tar.gz"
    return (summary.read_text() if summary.exists() else ""), (_archived(archive) if archive.exists() else [])


def test_run_all_packs_each_job_as_it_ends(dry_run):
    """The jobs were packed once, after the last: a call cut off in a later job brought back none of them."""
    summary, names = _run_all(dry_run, {"fake_a": "# limit: 5\necho done > \"$JOB_OUT/a.txt\"",
                                        "fake_b": "# limit: 500\nsleep 30"}, cut_at=4)
    assert summary.startswith("fake_a rc=0 5s-limit") and "./fake_a/a.txt" in names, (summary, names)


def test_run_all_holds_every_job_inside_the_call(dry_run):
    """Each job ran under its own limit whatever was left of the call: limits that summed past it were cut off by the
    call's end (and, packed at the end, brought nothing back)."""
    jobs = {"fake_a": "# limit: 5\ntrue", "fake_b": "# limit: 500\ntrue"}
    summary, _ = _run_all(dry_run, jobs, cut_at=20, CALL_LIMIT="40")
    a, b = summary.splitlines()
    assert a.startswith("fake_a rc=0 5s-limit") and int(b.split()[2].removesuffix("s-limit")) <= 25, summary
    summary, _ = _run_all(dry_run, jobs, cut_at=20, CALL_LIMIT="20")
    assert [line.split(":")[0] for line in summary.splitlines()] == ["fake_a skipped", "fake_b skipped"], summary


def test_run_all_gives_each_job_its_cut_limit_as_limit(dry_run):
    """A job that bounds its steps by LIMIT (gpu/tools/job_limit.sh) read its own limit line, not the cut that run_all
    ran it under: its last step ran past that cut and was killed before it reported."""
    import tarfile

    body = "echo \"$LIMIT\" > \"$JOB_OUT/limit.txt\""
    summary, _ = _run_all(dry_run, {"fake_a": f"# limit: 5\n{body}", "fake_b": f"# limit: 500\n{body}"}, cut_at=20,
                          CALL_LIMIT="40")
    cut = [line.split()[2].removesuffix("s-limit") for line in summary.splitlines()]
    with tarfile.open(dry_run.out / "results.tar.gz") as archive:
        given = [archive.extractfile(f"./{job}/limit.txt").read().decode().strip() for job in ("fake_a", "fake_b")]
    assert cut[0] == "5" and int(cut[1]) <= 25 and given == cut, (summary, given)


def _old_runtime(dry_run) -> None:
    """.whl/runtime_s46.tgz as host_load_ab.sh expects it (`git archive REV runtime | gzip -n`)."""
    tree = dry_run.root / "old_runtime"
    (tree / "runtime").mkdir(parents=True)
    (tree / "runtime" / "__init__.py").write_text("")
    (dry_run.repo / ".whl").mkdir(exist_ok=True)
    subprocess.run(["tar", "czf", str(dry_run.repo / ".whl" / "runtime_s46.tgz"), "-C", str(tree), "runtime"],
                   check=True)


def test_all_gpu_tests_bounds_a_hung_runtime_verify_and_fails(dry_run):
    """`runtime verify` had no bound of its own: a hung probe launch took the job's whole limit (300 s; with pytest's
    280 past it). It is cut at VERIFY_LIMIT (30 s unless set), reported as 124, and the GPU tests still run."""
    start = time.monotonic()
    rc, output = dry_run("gpu/jobs/all_gpu_tests.sh", VERIFY_LIMIT="2", FAKE_HANG="runtime verify")
    assert time.monotonic() - start < 2 + 8, output
    assert rc != 0 and "all_gpu_tests: runtime verify rc=124, pytest rc=0" in output, output
    assert "212 passed" in output, output


def test_host_load_ab_keeps_inside_its_limit_where_its_steps_hang(dry_run):
    """Its steps' own timeouts summed to 1070 s against a limit of 560 (a call of 600): a hanging benchmark ran the
    call out before the rounds' archive and step 3. Each step now gets what is left of LIMIT."""
    _old_runtime(dry_run)
    start = time.monotonic()
    _, output = dry_run("gpu/jobs/host_load_ab.sh", LIMIT="12", FAKE_HANG="bench_runtime.py")
    took = time.monotonic() - start
    assert took < 12 + 5 and (dry_run.out / "host_load_ab" / "load_ab.tgz").exists(), (took, output)
    assert "old round 1 rc=124" in output and "=== took" in output, output
    assert not (dry_run.repo / "ab").exists(), "host_ab.py's trees are left in the checkout"


def test_host_load_ab_packs_this_calls_rounds_only(dry_run):
    """The fixed /tmp/load_ab kept an earlier call's rounds on a warm machine: a round that wrote nothing this time was
    packed (and summarised) from the earlier call's JSON."""
    _old_runtime(dry_run)
    rc, output = dry_run("gpu/jobs/host_load_ab.sh")
    assert rc == 0 and "new round 3 rc=0" in output, output
    archive = dry_run.out / "host_load_ab" / "load_ab.tgz"
    first = _archived(archive)
    assert "./load_ab_new_3.json" in first, first
    archive.unlink()
    dry_run("gpu/jobs/host_load_ab.sh", FAKE_NO_WRITE="bench_runtime")
    second = _archived(archive)
    assert not [name for name in second if name.endswith(".json")], second


def _limit(job: str) -> int | None:
    """The seconds of a job's `# limit:` line (among its first three), None where it has none."""
    lines = (ROOT / "gpu" / "jobs" / f"{job}.sh").read_text().splitlines()[:3]
    return next((int(line.split()[2]) for line in lines if line.startswith("# limit:")), None)


@pytest.mark.parametrize("job", JOBS)
def test_a_job_says_its_limit_within_one_call(job):
    """A job's first lines say its time limit (gpu/README.md), which run_all.sh runs it under: indexer_pdl.sh (its own
    timeouts 120 + 300 s) and s41_probe.sh (330 + 150 s) said none and got run_all.sh's default 120 s."""
    limit = _limit(job)
    assert limit is not None and 0 < limit <= 590, (ROOT / "gpu" / "jobs" / f"{job}.sh").read_text().splitlines()[:3]


# The time bounds of the jobs, read from their text. A job's `# limit:` line is what run_all.sh runs it under (and a
# session plans a call by); steps whose own timeouts add up past it were cut off there, with whatever they had not
# written yet: cache_ab.sh's came to 840 s against its 560, verify_all.sh gave its indexer job LIMIT + 15 - SECONDS.
# A job either cuts every step to what is left of its limit with gpu/tools/job_limit.sh's cap (sourced directly or by
# topk_checks.sh and ncu_stalls.sh), or bounds its steps by LIMIT (or its budget) in arithmetic of its own
# (SELF_BOUNDED), or has fixed timeouts whose worst case, summed as below, is within its limit.
JOBS_DIR = ROOT / "gpu" / "jobs"
CAP_TOOLS = ("job_limit", "topk_checks", "ncu_stalls")
SELF_BOUNDED = {"verify_all", "tree_ab", "tree_checks", "indexer", "mla_support", "topk_sanitize_full"}
_TIMEOUT = re.compile(r"(?<![\w-])timeout\s+(?:--[\w-]+(?:=\S+)?\s+)*(\S+)")
_CALL = re.compile(r"\bbash\s+(\"\$0\"|gpu/(?:jobs|tools)/\w+\.sh)")


def _logical_lines(text: str) -> list[str]:
    """The script's commands: comments dropped, heredoc bodies skipped, continued lines and multi-line quoted strings
    (python -c) joined into one."""
    out, cur, heredoc = [], "", None
    for line in text.splitlines():
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if not cur and line.lstrip().startswith("#"):
            continue
        if not cur or cur.count('"') % 2 == 0:
            line = re.sub(r"\s+#\s.*$", "", line)  # a trailing comment (# after a blank, outside a string)
        cur = f"{cur}\n{line}" if cur else line
        if cur.endswith("\\"):
            cur = cur[:-1]
            continue
        if len(re.findall(r'(?<!\\)"', cur)) % 2:
            continue  # a quoted string that goes on past this line
        tag = re.search(r"(?<!<)<<-?\s*(['\"]?)([A-Za-z_]\w*)\1", cur)
        if tag:
            heredoc = tag.group(2)
        out.append(cur)
        cur = ""
    return out


def _uses_cap(text: str) -> bool:
    """The script sources gpu/tools/job_limit.sh, directly or by one of the tools that do."""
    code = _logical_lines(text)
    return any(re.match(rf"\s*source\s+gpu/tools/{tool}\.sh\b", line) for tool in CAP_TOOLS for line in code)


def _static_worst_case(job: str) -> tuple[int, list[str]]:
    """(seconds, what could not be bounded) of a job without cap: every literal timeout (a number, or a ${VAR:-N}
    default) once, times the words of the literal lists of the for loops around it; a job it runs, its limit line
    (unless a timeout on the same line bounds it); gpu/tools/mla_sanitize.sh, its seconds. Branches are all taken."""
    total, unbounded, loops, function = 0, [], [], False
    for line in _logical_lines((JOBS_DIR / f"{job}.sh").read_text()):
        stripped = line.strip()
        times = 1
        header = re.match(r"\w+\(\)\s*\{", stripped)
        if function or header:  # a function's body: it would count once a call, which this does not follow
            function = not stripped.endswith("}") if header else stripped != "}"
            if _TIMEOUT.search(line) or _CALL.search(line):
                unbounded.append(f"in a function: {stripped}")
            continue
        if re.match(r"done\b", stripped):
            if not loops:
                unbounded.append(f"a loop it could not follow: {stripped}")
            loops = loops[:-1]
            continue
        loop = re.match(r"(?:for\s+\w+\s+in\s+(.*?)|while\s.*?)\s*;\s*do\b\s*(.*)$", stripped, re.DOTALL)
        if loop:
            words = (loop.group(1) or "$").split()
            count = None if any(set(w) & set("$*`()[]") for w in words) else len(words)
            if not re.search(r"\bdone\b", loop.group(2)):
                loops.append(count)
                continue
            stripped, times = loop.group(2), count  # a loop on one line
        for count in loops:
            times = None if times is None or count is None else times * count
        seconds = 0
        timeouts = _TIMEOUT.findall(stripped)
        for arg in timeouts:
            literal = re.fullmatch(r'"?(?:(\d+)|\$\{\w+:-(\d+)\})"?', arg)
            if literal:
                seconds += int(literal.group(1) or literal.group(2))
            else:
                unbounded.append(f"timeout {arg}: {stripped}")
        for callee in _CALL.findall(stripped):
            sanitize = re.search(r"gpu/tools/mla_sanitize\.sh\s+(\d+)", stripped)
            if timeouts:
                continue  # bounded by the timeout on its line
            if callee.startswith("gpu/jobs/"):
                seconds += _limit(Path(callee).stem)
            elif sanitize:
                seconds += int(sanitize.group(1))
            else:
                unbounded.append(f"runs {callee}: {stripped}")
        for tool in re.findall(r"^source\s+gpu/tools/(\w+)\.sh", stripped):
            if _TIMEOUT.search((ROOT / "gpu" / "tools" / f"{tool}.sh").read_text()):
                unbounded.append(f"sources {tool}.sh, whose steps have timeouts")
        if seconds and times is None:
            unbounded.append(f"in a loop over what is carried: {stripped}")
        elif seconds and re.search(r"(?<!&)&\s*$", stripped):
            unbounded.append(f"in the background: {stripped}")
        else:
            total += seconds * times
    return total, unbounded


@pytest.mark.parametrize("job", JOBS)
def test_a_jobs_own_bounds_keep_inside_its_limit_line(job):
    """cache_ab.sh's steps had 840 s of timeouts against its limit of 560, row_loads_ab.sh's 725, indexer_tp.sh's 220
    against 120, session_close.sh's 600 against 560, and verify_all.sh gave its last phase LIMIT + 15 - SECONDS: a
    step that hung (or a slow one) ran the job past the line run_all.sh cuts it at, and what came after was lost."""
    text = (JOBS_DIR / f"{job}.sh").read_text()
    code = "\n".join(_logical_lines(text))
    limit = _limit(job)
    for default in re.findall(r"\$\{LIMIT:-(\d+)\}|^limit=(\d+)$", code, re.MULTILINE):
        assert int(default[0] or default[1]) == limit, f"{job}: its own LIMIT default {default} is not its limit line"
    assert not re.search(r"LIMIT\s*\+", code), f"{job}: a bound past its LIMIT"
    if job in SELF_BOUNDED:
        return
    if _uses_cap(text):
        for line in _logical_lines(text):
            for arg in _TIMEOUT.findall(line):
                assert arg.startswith('"$(cap'), f"{job}: a timeout not cut to what is left: {line.strip()}"
            for callee in _CALL.findall(line):
                assert "$(cap " in line or "$(time_left)" in line, f"{job}: runs {callee} whatever is left: {line}"
                if re.search(r"\bLIMIT=\$\(cap ", line):
                    assert _uses_cap((ROOT / callee).read_text()), f"{job}: {callee} does not read the LIMIT given"
                if re.search(r"\bROUND_CAP=\$\(cap ", line):
                    assert "ROUND_CAP" in (ROOT / callee).read_text(), f"{job}: {callee} does not read ROUND_CAP"
        return
    worst, unbounded = _static_worst_case(job)
    assert not unbounded, f"{job}: bound its steps with gpu/tools/job_limit.sh's cap: {unbounded}"
    assert worst <= limit, f"{job}: its timeouts add up to {worst} s against its limit of {limit}"


def test_the_shared_step_tools_cut_every_step_to_what_is_left():
    """topk_checks.sh's five steps (205 s) and ncu_stalls.sh's profiles (50 s each) ran whole whatever was left of the
    job that sourced them; gpu/tools/h200_grids.sh's decode_topk grid took its 120 s past the job's limit."""
    for tool in ("topk_checks", "ncu_stalls"):
        text = (ROOT / "gpu" / "tools" / f"{tool}.sh").read_text()
        assert "source gpu/tools/job_limit.sh" in text, tool
        args = [arg for line in _logical_lines(text) for arg in _TIMEOUT.findall(line)]
        assert args and all(arg.startswith('"$(cap') for arg in args), (tool, args)
    grids = _logical_lines((ROOT / "gpu" / "tools" / "h200_grids.sh").read_text())
    assert [arg for line in grids for arg in _TIMEOUT.findall(line)] == ["$((left", '"$left"'], grids


def test_verify_alls_indexer_job_ends_inside_its_limit():
    """verify_all.sh said 560 s while it gave the indexer job LIMIT + 15 - SECONDS after the sanitizers' LIMIT - 100:
    up to 575 s, past its line (and run_all.sh's cut). The indexer job's share now leaves the last pack its seconds
    inside LIMIT, and the sanitizers leave the indexer job its own limit."""
    text = (JOBS_DIR / "verify_all.sh").read_text()
    limit = _limit("verify_all")
    (indexer_reserve,) = re.findall(r"^left=\$\(\(LIMIT - (\d+) - SECONDS\)\)$", text, re.MULTILINE)
    (sanitizers_reserve,) = re.findall(r"^each=\$\(\(LIMIT - (\d+) - SECONDS\)\)", text, re.MULTILINE)
    assert int(indexer_reserve) >= 5 and int(sanitizers_reserve) >= int(indexer_reserve) + _limit("indexer")
    assert limit <= 580 and "ROUND_CAP=$left " in text


@pytest.mark.parametrize("job, env", [
    ("cache_ab", {}),
    ("session_close", {"FAKE_GPU_NAME": "NVIDIA H200", "OLD_RUNTIME": ".whl/cand.tgz"}),
])
def test_a_job_whose_every_step_hangs_ends_inside_its_limit(dry_run, job, env):
    """Every step hangs (the stub python3 on a path, each compute-sanitizer tool): cut to what is left of LIMIT, the
    job ends inside it; cache_ab.sh's steps took their own 840 s (here 30 s each, the stub's sleep), and
    session_close.sh's launch_micro.py rounds had no bound at all (six of them: 180 s here)."""
    dry_run.candidate()  # the archive OLD_RUNTIME names
    limit = 12
    start = time.monotonic()
    dry_run(f"gpu/jobs/{job}.sh", timeout=120, LIMIT=str(limit), FAKE_HANG="/", FAKE_memcheck="hang",
            FAKE_synccheck="hang", FAKE_racecheck="hang", **env)
    assert time.monotonic() - start < limit + 4


# --- seventy-sixth session's audit: failures that the verdicts reported as passes ------------------------------------

PASSTHROUGH_SANITIZER = r"""#!/usr/bin/env bash
# compute-sanitizer whose pytest target runs for real (DRY_PYTHON), as a sanitized process that sees no CUDA device
while [ $# -gt 0 ]; do case "$1" in --tool|--report-api-errors|--error-exitcode|--print-limit) shift 2;; *) break;; esac
done
if [ "$1" = python3 ] && [ "$2" = -m ] && [ "$3" = pytest ]; then shift; "$DRY_PYTHON" "$@"; rc=$?; else "$@"; rc=$?; fi
echo "========= ERROR SUMMARY: 0 errors"; exit $rc
"""


def test_pool_rows_memcheck_fails_where_its_tests_skip(dry_run):
    """topk_pool_rows' memcheck passed on its exit status alone: where the sanitized process saw no device, every
    test skipped, pytest exited 0, and host_changes said "every step passed". It now requires the GPU, as the other
    test steps do, so a skip fails it."""
    stub = dry_run.bin / "compute-sanitizer"
    stub.write_text(PASSTHROUGH_SANITIZER)
    rc, output = dry_run("gpu/jobs/host_changes.sh", PYTHONPATH=str(dry_run.repo))
    assert rc == 1 and output.splitlines()[-1].startswith("host_changes: FAILED: pool_rows memcheck"), output


def test_verify_all_runs_every_topk_sanitizer_shard_whatever_the_callers_environment(dry_run):
    """ONLY_SHARDS or CROWDED in the caller's environment reached verify_all's decode_topk sanitizers (TOOL=all) and
    shrank them to the shards named, whose verdict "1 of 1 shards clean" passed while shards 3 and 5 crash."""
    rc, output = dry_run("gpu/jobs/verify_all.sh", ONLY_SHARDS="0", CROWDED="skip", FAKE_3="crash", FAKE_5="crash")
    assert rc == 1 and "decode_topk sanitizers" in output.splitlines()[-1], output


def test_bench_indexer_exits_1_where_a_size_raised(monkeypatch):
    """bench_indexer.py recorded a size that raised (the AOT rows unlike the reference's, a fault) in its JSON and
    exited 0, so the indexer job, host_changes and verify_all passed a wrong selection. A target missed still exits
    0."""
    import torch

    import benchmarks.bench_indexer as bench

    outcomes = {}
    monkeypatch.setattr(bench, "DeepGemmScorer", lambda: None)
    seeded = type("Generator", (), {"manual_seed": lambda self, seed: self})
    monkeypatch.setattr(torch, "Generator", lambda device=None: seeded())
    monkeypatch.setattr(bench, "run_sizes", lambda *args, **kwargs: outcomes["results"])
    monkeypatch.setattr(sys, "argv", ["bench_indexer.py", "--quick", "--out", "unused.json"])
    outcomes["results"] = [{"rows": 1, "context": 8192, "meets_target": False}]
    assert bench.main() == 0
    outcomes["results"] = [{"rows": 1, "context": 8192, "meets_target": True},
                           {"rows": 8, "context": 65536, "error": "RuntimeError: the AOT step's rows differ"}]
    assert bench.main() == 1


@pytest.mark.parametrize("tool, summaries, clean", [
    ("memcheck", ["========= ERROR SUMMARY: 0 errors"], True),
    ("memcheck", ["========= ERROR SUMMARY: 0 errors", "========= ERROR SUMMARY: 2 errors"], False),
    ("racecheck", ["========= RACECHECK SUMMARY: 4 hazards displayed (0 errors, 9 warnings)"], True),
    ("racecheck", ["========= RACECHECK SUMMARY: 4 hazards displayed (0 errors, 9 warnings)",
                   "========= RACECHECK SUMMARY: 1 hazard displayed (1 errors, 0 warnings)"], False),
])
def test_a_report_with_any_summary_counting_errors_is_not_clean(tmp_path, tool, summaries, clean):
    """report_clean took a report whose summaries included one at 0 errors (a child process's report beside the
    parent's), whatever the others counted."""
    report = tmp_path / "report.txt"
    report.write_text("\n".join(["6/6 cases match", *summaries, "rc=0"]) + "\n")
    script = f'source gpu/tools/sanitizer_verdict.sh; report_clean "{report}" {tool} "cases match"'
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, check=False)
    assert (proc.returncode == 0) == clean


@pytest.mark.parametrize("env, budget", [({}, 110), ({"LIMIT": "30"}, 30), ({"ROUND_CAP": "20", "LIMIT": "30"}, 20),
                                         ({"ROUND_CAP": "90", "LIMIT": "400"}, 90)])
def test_indexer_job_keeps_to_a_cut_limit(dry_run, env, budget):
    """indexer.sh bounded its steps by its limit line and ROUND_CAP, not by the LIMIT run_all.sh cut it to: a cut job
    was killed in its last step, its reports unwritten. Its budget is now the least of the three."""
    _, output = dry_run("gpu/jobs/indexer.sh", timeout=120, **env)
    assert f"budget={budget}s" in output, output


def _patch_of(path: str, old: str, new: str) -> str:
    """A unified diff of one file of the checkout, as git apply reads it."""
    text = (ROOT / path).read_text(encoding="utf-8")
    assert old in text
    lines = difflib.unified_diff(text.splitlines(keepends=True), text.replace(old, new, 1).splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}")
    return "".join(lines)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
@pytest.mark.parametrize("case", ["slot", "contract", "runtime", "stale", "broken"])
def test_mla_candidate_cache_refuses_what_it_cannot_time_as_a_cache_root(tmp_path, case):
    """gpu/tools/mla_candidate_cache.sh builds a second cache root for mla_bench_ab.sh, which times any
    .gl/mlacand[0-9] holding a manifest. It refuses a slot that glob does not match, a patch outside kernels/ and
    tests/ (the GPU machine runs the checkout's runtime: only the cubins travel), a patch that does not apply to HEAD,
    and a patch whose build fails leaves no slot behind (a copy of the committed cache there was timed as the
    candidate)."""
    if case == "broken" and importlib.util.find_spec("cutlass") is None:
        pytest.skip("needs CuTe DSL (the build's import of the broken kernel)")
    kernel = "kernels/sparse_mla_decode.py"
    patch = tmp_path / "cand.diff"
    if case == "contract":
        patch.write_text(_patch_of("runtime/contract/sparse_mla_decode.py", '"""', '"""(a candidate) '))
    elif case == "runtime":
        patch.write_text(_patch_of("runtime/sparse_mla.py", '"""', '"""(a candidate) '))
    elif case == "stale":  # a line the patch removes that HEAD no longer has
        diff = _patch_of(kernel, '"""', '"""(a candidate) ')
        removed = next(line for line in diff.splitlines() if line.startswith('-"""'))
        patch.write_text(diff.replace(removed, '-"""(an older first line)', 1))
    elif case == "broken":
        patch.write_text(_patch_of(kernel, "\nimport ", "\nimport ( "))
    else:
        patch.write_text(_patch_of(kernel, '"""', '"""(a candidate) '))
    args = [str(patch), "10" if case == "slot" else "9"]
    slots = (ROOT / ".gl" / "mlacand9", ROOT / ".gl" / "mlacand9.partial")
    assert not any(p.exists() for p in slots)
    proc = subprocess.run(["bash", "gpu/tools/mla_candidate_cache.sh", *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=300)
    expected = {"slot": (2, "SLOT must be one digit"), "contract": (1, "candidate_tree.sh"),
                "runtime": (1, "runtime/sparse_mla.py"), "stale": (1, "does not apply to HEAD"),
                "broken": (1, "")}[case]
    assert (proc.returncode, expected[1] in proc.stderr + proc.stdout) == (expected[0], True), proc.stderr
    assert not any(p.exists() for p in slots)
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "mla_candidate." not in worktrees
