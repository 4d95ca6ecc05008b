"""The build step: reproducible cubins equal to the committed ones, safe concurrent builds,
and a runtime that never imports CuTe DSL."""

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runtime import errors
from runtime.contract import all_variants
from runtime.manifest import BUILD_LOCK, check_cache, manifest_path

REPO = Path(__file__).resolve().parent.parent
BUILD = [sys.executable, str(REPO / "build_kernels.py")]

pytest.importorskip("cutlass", reason="the build needs nvidia-cutlass-dsl (extra 'build')")


def build(out: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(BUILD + ["--only", "probe", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def shas(root: Path, arch: str) -> dict:
    data = json.loads(manifest_path(root, arch).read_text())
    return {k["name"]: k["sha256"] for k in data["kernels"] if k["family"] == "probe"}


def test_probe_build_is_reproducible_and_matches_the_committed_cache(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    proc = build(first)
    parallel = build(second, "--jobs", "1000")  # capped at this process's CPUs: 41 processes on 2 CPUs took 10.7 GB
    assert f"compiling with --jobs {len(os.sched_getaffinity(0))}" in parallel.stderr
    assert "probe_cluster8" in proc.stdout and "compiled 4 variant(s)" in proc.stdout
    for arch in ("sm_90a", "sm_100a"):
        assert shas(first, arch) == shas(second, arch) == shas(REPO, arch), arch
        check_cache(first, arch)


def test_four_concurrent_builds_leave_a_valid_cache(tmp_path):
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: build(tmp_path), range(4)))
    for arch in ("sm_90a", "sm_100a"):
        manifest = check_cache(tmp_path, arch)
        assert set(manifest.kernels) == {"probe_cluster2", "probe_cluster8"}
    leftovers = [p for p in tmp_path.rglob(".*") if p.name != ".build.lock"]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def test_manifest_records_the_contract():
    for arch in ("sm_90a", "sm_100a"):
        data = json.loads(manifest_path(REPO, arch).read_text())
        assert data["toolchain"]["nvidia-cutlass-dsl"] and data["source_hash"]
        by_name = {k["name"]: k for k in data["kernels"]}
        for v in all_variants(arch, ("probe", "empty")):
            k = by_name[v.name]
            assert [(p["name"], p["ctype"]) for p in k["params"]] == [(p.name, p.ctype) for p in v.params]
            assert k["threads"] == v.threads and tuple(k["cluster"]) == v.cluster
            assert k["smem_bytes"] == v.smem_bytes and k["pdl"] == v.pdl
            assert k["non_portable_cluster"] == (v.cluster_size > 8)


def test_runtime_cpu_api_never_imports_cutedsl():
    code = (
        "import sys, runtime\n"
        "from runtime.manifest import check_cache, default_root\n"
        "from runtime.contract import all_variants\n"
        "import runtime.reference, runtime.cubin\n"
        "import importlib, pkgutil\n"  # every runtime module: the host ops, the indexer, scoring, verify
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(runtime.__path__, 'runtime.')]\n"
        "check_cache(default_root(), 'sm_90a'); all_variants()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'kernels', 'cute'))\n"
        "print('BAD', bad); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_plain_install_carries_cubins_and_manifests(tmp_path):
    """A non-editable `pip install .` ships the cache as data files the runtime finds."""
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    prefix = "sparse_decode_aot-0.1.0.data/data/share/sparse_decode_aot/"
    for arch in ("sm_90a", "sm_100a"):
        assert prefix + f"manifests/{arch}.json" in names
        for k in json.loads(manifest_path(REPO, arch).read_text())["kernels"]:
            assert prefix + k["cubin"] in names, k["cubin"]
    assert "runtime/loader.py" in names and "runtime/contract/__init__.py" in names
    assert not any(n.startswith(("kernels/", "cutlass")) for n in names)


def test_check_names_each_differing_variant(tmp_path):
    build(tmp_path)
    path = manifest_path(tmp_path, "sm_90a")
    data = json.loads(path.read_text())
    entry = next(k for k in data["kernels"] if k["name"] == "probe_cluster8")
    entry["sha256"] = "0" * 64
    path.write_text(json.dumps(data))
    proc = subprocess.run(BUILD + ["--only", "probe", "--out", str(tmp_path), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "sm_90a probe_cluster8: cubin sha256 differs" in proc.stdout
    assert "probe_cluster2" not in proc.stdout.split("CHECK FAILED")[-1]


def test_committed_cache_is_current():
    """The committed cubins and manifests are what the committed sources build (all families)."""
    proc = subprocess.run(BUILD + ["--check", "--jobs", "2"], capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["kernels"][1].update(smem_bytes=64), "probe_cluster8: committed manifest entry differs in smem"),
    (lambda d: d["kernels"][1].update(cluster=[4, 1, 1]), "probe_cluster8: committed manifest entry differs in clu"),
    (lambda d: d["kernels"][0].update(pdl=False), "probe_cluster2: committed manifest entry differs in pdl"),
    (lambda d: d["kernels"].append(dict(d["kernels"][0], name="probe_gone")),
     "probe_gone: in the committed manifest but not built"),
    (lambda d: d["toolchain"].update(python="3.10"), "sm_90a: toolchain differs from the committed build's (python)"),
    # passed: no entry differs, and the runtime reads past an unknown field and keys the entries by name
    (lambda d: d.update(patched_by="hand"), "sm_90a: committed manifest has fields no build writes (patched_by)"),
    (lambda d: d["kernels"].reverse(), "sm_90a: committed manifest lists its kernels in another order"),
])
def test_check_compares_every_manifest_field(tmp_path, edit, match):
    """--check holds each committed entry (not only its sha256) against the fresh build's."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    assert build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",)) == []
    edit_manifest(committed, "sm_90a", edit)
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert len(problems) == 1 and match in problems[0], problems


@pytest.mark.parametrize("edit", [
    lambda d: d["kernels"][0].update(pdl=1),  # == True in Python, not a JSON boolean to the runtime
    lambda d: d["kernels"][0].update(threads=float(d["kernels"][0]["threads"])),
    lambda d: d["kernels"][0].update(config={k: float(v) for k, v in d["kernels"][0]["config"].items()}),
    lambda d: d["kernels"].append(dict(d["kernels"][0])),  # a duplicate entry, collapsed by a dict of names
    lambda d: d.update(schema=2),
    lambda d: d.update(arch="sm_100a"),
])
def test_check_fails_where_the_runtime_refuses_the_committed_manifest(tmp_path, edit):
    """--check passed ("check passed") committed manifests every load refuses, since its comparison is Python's ==
    over parsed JSON and by kernel name: now the committed manifest must also read as the runtime reads it."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels
    from runtime.manifest import check_against_contract, read_manifest

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    edit_manifest(committed, "sm_90a", edit)
    with pytest.raises(errors.CacheError):
        check_against_contract(read_manifest(committed, "sm_90a"))
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert len(problems) == 1 and "sm_90a: the runtime refuses the committed manifest" in problems[0], problems


def test_partial_build_keeps_the_manifest_order_and_the_source_stamp(tmp_path):
    """--only rebuilds some families into a whole cache: the manifest keeps the contract's order (byte for byte the
    committed one here, as nothing changed) and the previous source_hash, which names the sources of the entries it
    kept (a stamp of today's sources would hide their change from --check)."""
    import shutil

    shutil.copytree(REPO / "cubins", tmp_path / "cubins")
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    build(tmp_path, "--arch", "sm_90a")
    assert manifest_path(tmp_path, "sm_90a").read_bytes() == manifest_path(REPO, "sm_90a").read_bytes()
    path = manifest_path(tmp_path, "sm_90a")
    path.write_text(path.read_text().replace(json.loads(path.read_text())["source_hash"], "f" * 64))
    build(tmp_path, "--arch", "sm_90a")
    data = json.loads(path.read_text())
    assert data["source_hash"] == "f" * 64
    assert [k["name"] for k in data["kernels"]] == [v.name for v in all_variants("sm_90a")]


@pytest.mark.parametrize("args, match", [(["--jobs", "0"], "--jobs: 0 must be at least 1"),
                                         (["--out", "FILE"], "a file, not a directory; name the cache root's"),
                                         (["--out", "FILE/sub"], "not a writable directory (Not a directory); name a"),
                                         # Path("") is the current directory: --out "$UNSET" built there
                                         (["--out", ""], "--out: an empty path names no folder"),
                                         (["--warm-deepgemm", "--deepgemm-cache-dir", ""],
                                          "--deepgemm-cache-dir: an empty path names no folder"),
                                         (["--max-rows", "64"], "--deepgemm-cache-dir go with --warm-deepgemm"),
                                         (["--warm-deepgemm", "--index-heads", "0"], "--index-heads: 0 must be"),
                                         (["--warm-deepgemm", "--jobs", "2", "--check"],
                                          "builds no cubins: drop --only, --jobs, --check (run the build as its own"),
                                         (["--warm-deepgemm", "--jobs", "0"], "builds no cubins: drop --only, --jobs"),
                                         # it compiled nothing of the family, rewrote the manifest and exited 0
                                         (["--only", "sparse_mla_decode", "--arch", "sm_100a"],
                                          "--only sparse_mla_decode: the contract has no variant of it for sm_100a"),
                                         # the fix said "name the archs it has (--arch)" without naming them
                                         (["--only", "sparse_mla_decode"],
                                          "for sm_100a; build it with --arch sm_90a, or drop that --only")])
def test_bad_arguments_are_refused_before_compiling(tmp_path, args, match):
    afile = tmp_path / "afile"
    afile.write_text("")
    args = [a.replace("FILE", str(afile)) for a in args]
    proc = subprocess.run(BUILD + ["--only", "probe", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and match in proc.stderr, proc.stdout + proc.stderr
    assert "compiled" not in proc.stdout


def test_check_of_an_out_naming_a_file_is_refused_before_compiling(tmp_path, monkeypatch, capsys):
    """--check --out FILE compiled every variant asked (minutes), then reported the committed manifest unreadable
    ('Not a directory') and named for its fix a build with that --out, which the build refuses ('a file, not a
    directory'): refused before compiling, as the build refuses it."""
    import build_kernels

    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setattr(build_kernels, "compile_all", lambda *args: pytest.fail("compiled for a check of a file"))
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--check", "--only", "probe", "--arch", "sm_90a", "--out", str(afile)])
    assert stop.value.code == 2
    assert f"--out {afile}: a file, not a directory" in capsys.readouterr().err


def test_warm_deepgemm_takes_the_serving_shapes(tmp_path, monkeypatch, capsys):
    """--warm-deepgemm warmed DeepGEMM for fixed shapes (256 rows, 64 heads of 128) and printed nothing: a model with
    32 index heads or head dim 64, or a rank with more rows, still compiled at serving time. Its shapes and cache
    directory are now options, and what it compiled is printed as JSON; a shape DeepGEMM refuses is a usage error."""
    import build_kernels
    from runtime import scoring

    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)  # --deepgemm-cache-dir sets it: restored after the test
    calls = []

    def warm(shapes, cache_dir):
        calls.append((shapes, cache_dir))
        if shapes.heads == 48:
            raise ValueError("q: 48 index heads; DeepGEMM on sm_90 takes 32 or 64")
        return {"row_buckets": list(range(32, shapes.max_rows + 32, 32)), "new_files": []}

    monkeypatch.setattr(scoring, "warm_deepgemm", warm)
    monkeypatch.setattr(scoring, "deepgemm_status", lambda: (True, "ok"))  # a GPU machine's answer, stood in for
    assert build_kernels.main(["--warm-deepgemm", "--max-rows", "64", "--index-heads", "32", "--index-head-dim", "64",
                               "--deepgemm-cache-dir", str(tmp_path)]) == 0
    assert calls == [(scoring.ServingShapes(max_rows=64, heads=32, head_dim=64), tmp_path)]
    assert json.loads(capsys.readouterr().out) == {"row_buckets": [32, 64], "new_files": []}
    assert build_kernels.main(["--warm-deepgemm"]) == 0
    assert calls[-1] == (scoring.ServingShapes(), None)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--warm-deepgemm", "--index-heads", "48"])
    assert stop.value.code == 2
    assert "--warm-deepgemm: q: 48 index heads; DeepGEMM on sm_90 takes 32 or 64" in capsys.readouterr().err

    monkeypatch.setattr(scoring, "deepgemm_status", lambda: (False, "no CUDA device"))  # this machine's answer
    assert build_kernels.main(["--warm-deepgemm"]) == 1
    # the refusal named no fix: where to run it, and the install it needs
    assert capsys.readouterr().err == ("build_kernels.py: --warm-deepgemm: no CUDA device; it warms DeepGEMM for the "
                                       "GPU it runs on: run it on each serving GPU model (sm_90 or sm_100), with "
                                       "DeepGEMM installed (pip install -e \".[deepgemm]\")\n")
    assert len(calls) == 3  # nothing warmed


@pytest.mark.parametrize("extra", [[], ["--check"]])
def test_a_build_without_cute_dsl_says_which_extra_to_install(tmp_path, monkeypatch, capsys, extra):
    """After a plain `pip install -e .` (no 'build' extra) the build stopped in a bare ModuleNotFoundError traceback:
    now a usage error naming the package and the install command."""
    import build_kernels

    monkeypatch.setitem(sys.modules, "cutlass", None)  # what `import cutlass` meets where it is not installed
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path), *extra])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "CuTe DSL (nvidia-cutlass-dsl), which does not import here" in err and 'pip install -e ".[build]"' in err
    assert not (tmp_path / "manifests").exists()


def test_another_cute_dsl_release_is_refused_naming_the_pin(tmp_path, monkeypatch, capsys):
    """A CuTe DSL release other than the pin built and stamped its version without a word (a later --check said the
    toolchain differs; its fix, a rebuild with that release, stamped it again). Refused before compiling, naming both
    versions and the install; the override builds. The pin is read from setup.cfg."""
    import configparser
    import importlib.metadata

    import build_kernels

    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    assert f"nvidia-cutlass-dsl=={build_kernels.cute_dsl_pin()}" in extras["options.extras_require"]["build"].split()
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "9.9.9" if name == "nvidia-cutlass-dsl" else real(name))
    monkeypatch.delenv(build_kernels.ANY_CUTE_DSL_ENV, raising=False)
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"nvidia-cutlass-dsl 9.9.9 is installed, the kernels are written for {build_kernels.cute_dsl_pin()}" in err
    assert 'pip install -e ".[build]"' in err and not (tmp_path / "manifests").exists()
    parser = build_kernels.argparse.ArgumentParser()
    monkeypatch.setenv(build_kernels.ANY_CUTE_DSL_ENV, "1")
    build_kernels._require_cute_dsl(parser)  # the override: no refusal


def test_hidden_and_dangling_source_files_are_not_hashed(tmp_path, monkeypatch):
    """An editor's lock link (``.#ptx.py``, dangling while a file has unsaved edits) stopped every build in a bare
    FileNotFoundError from the source hash; hidden names and anything not a regular file are left out of it."""
    import os

    import build_kernels

    (tmp_path / "kernels").mkdir()
    (tmp_path / "runtime" / "contract").mkdir(parents=True)
    (tmp_path / "kernels" / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(build_kernels, "REPO", tmp_path)
    before = build_kernels.source_hash()
    os.symlink("user@host.1234:1700000000", tmp_path / "kernels" / ".#a.py")
    (tmp_path / "kernels" / ".hidden").mkdir()
    (tmp_path / "kernels" / ".hidden" / "b.py").write_text("B = 1\n")
    assert build_kernels.source_hash() == before


def test_stale_source_bytecode_is_dropped_before_the_build_imports_it(tmp_path, monkeypatch):
    """Python reuses a .pyc whose recorded mtime and size match the source: a same-length edit within a second
    compiled the old kernel under the new source hash, and --check passed it. The build removes the sources' and the
    contract's bytecode caches before importing them, and nothing else's."""
    import build_kernels

    for d in ("kernels/sub/__pycache__", "runtime/contract/__pycache__", "runtime/__pycache__"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "x.cpython-311.pyc").write_bytes(b"stale")
    monkeypatch.setattr(build_kernels, "REPO", tmp_path)
    build_kernels._drop_source_bytecode()
    assert not (tmp_path / "kernels/sub/__pycache__").exists()
    assert not (tmp_path / "runtime/contract/__pycache__").exists()
    assert (tmp_path / "runtime/__pycache__/x.cpython-311.pyc").exists()


def test_sighup_and_sigquit_end_the_build_as_sigterm_does():
    """A closed terminal's SIGHUP (or Ctrl-\\'s SIGQUIT) during an arch's renames killed the build there, its new
    cubins under the old manifest and its staged copies left behind: both are held with SIGTERM through the renames
    and raise SystemExit(128 + signal) in the blocks that clean up."""
    import signal

    import build_kernels

    assert {signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT} <= set(build_kernels._EXIT_SIGNALS)
    for signum in (signal.SIGHUP, signal.SIGQUIT):
        before = signal.getsignal(signum)
        renamed = []
        with pytest.raises(SystemExit) as stop, build_kernels._sigterm_as_exit():
            with build_kernels._interrupts_deferred():
                signal.raise_signal(signum)
                for _ in range(100):  # the handler would run between these bytecodes: held, it only records
                    time.sleep(0.001)
                renamed.append(True)
            for _ in range(1000):
                time.sleep(0.001)
        assert renamed == [True], "the signal ended the block it was held for"
        assert stop.value.code == 128 + signum
        assert signal.getsignal(signum) is before


def test_a_build_lock_it_cannot_write_is_refused_before_compiling(tmp_path):
    """A lock file the build cannot open for writing (one a load by another account created; here a directory in its
    place) failed the build after minutes of compiling, with a bare PermissionError: now refused first."""
    (tmp_path / ".build.lock").mkdir()
    proc = subprocess.run(BUILD + ["--only", "probe", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 2 and "cannot open its build lock" in proc.stderr, proc.stdout + proc.stderr
    assert "compiled" not in proc.stdout


@pytest.mark.parametrize("full_at", ["second cubin", "manifest"])
def test_a_write_that_fails_halfway_replaces_nothing(tmp_path, monkeypatch, full_at):
    """write_cache replaced the cubins one by one: a full disk at the second left the first new cubin under the old
    manifest, whose sha256 every load then refused. Every cubin is now written and synced under a temporary name
    first, then all are renamed: the failure replaces nothing and leaves no temporary file. The manifest was staged
    only after the new cubins had been renamed into place, so a full disk at it (the last file, after the cubins took
    the space) left them under the old manifest too; it is now staged with them."""
    import errno
    import os

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    variants = all_variants("sm_90a", ("probe",))
    folder = cache / "cubins" / "sm_90a"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    cubins = {(v.name, "sm_90a"): before[f"{v.name}.cubin"] + b"\0" * 16 for v in variants}  # new builds
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(fd)
        staged = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if (len(synced) == 2) if full_at == "second cubin" else staged.startswith(".sm_90a.json."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SystemExit, match=rf"^build_kernels\.py: writing sm_90a's files in {cache} failed: No space "
                                         r"left on device; sm_90a and the archs after it keep their previous files"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing replaced, no temporary left
    assert not [p for p in (cache / "manifests").iterdir() if p.name.startswith(".")]
    check_cache(cache, "sm_90a")
    monkeypatch.setattr(os, "fsync", real_fsync)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {f"{v.name}.cubin": cubins[(v.name, "sm_90a")]
                                                                  for v in variants}
    check_cache(cache, "sm_90a")


def test_a_full_disk_at_the_second_arch_says_which_arch_was_written(tmp_path, monkeypatch):
    """A full disk ended the build in an OSError traceback, saying neither which arch failed nor that an arch before
    it had been replaced. It ends in one line naming both, the cache as it says."""
    import errno

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    variants = {arch: all_variants(arch, ("probe",)) for arch in ("sm_90a", "sm_100a")}
    before = {arch: {p.name: p.read_bytes() for p in (cache / "cubins" / arch).iterdir()} for arch in variants}
    cubins = {(v.name, arch): before[arch][f"{v.name}.cubin"] + b"\0" * 16 for arch, vs in variants.items() for v in vs}
    real_staged_copy = build_kernels._staged_copy

    def staged_copy(path, data):
        if "sm_100a" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_staged_copy(path, data)

    monkeypatch.setattr(build_kernels, "_staged_copy", staged_copy)
    with pytest.raises(SystemExit) as stop:
        build_kernels.write_cache(cache, variants, cubins, ("probe",))
    said = str(stop.value.code)
    assert said.startswith(f"build_kernels.py: writing sm_100a's files in {cache} failed: No space left on device "
                           f"({cache}/cubins/sm_100a/"), said
    assert "; sm_90a written new before it; sm_100a and the archs after it keep their previous files" in said
    assert {p.name: p.read_bytes() for p in (cache / "cubins" / "sm_100a").iterdir()} == before["sm_100a"]
    assert check_cache(cache, "sm_90a").kernels and check_cache(cache, "sm_100a").kernels


def test_a_failure_while_placing_an_archs_files_says_some_may_be_new(tmp_path, monkeypatch):
    """The full-disk line said an arch "keeps its previous files" for any OSError of the write, one while its staged
    files were renamed into place too, after which some cubins were the new ones (a load refused them by sha256)."""
    import errno

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    variants = all_variants("sm_90a", ("probe",))
    folder = cache / "cubins" / "sm_90a"
    cubins = {(v.name, "sm_90a"): (folder / f"{v.name}.cubin").read_bytes() + b"\0" * 16 for v in variants}

    def fsync_directory(directory):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(build_kernels, "_fsync_directory", fsync_directory)
    with pytest.raises(SystemExit) as stop:
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    said = str(stop.value.code)
    assert said.startswith(f"build_kernels.py: placing sm_90a's files in {cache} failed: Input/output error; some "
                           f"of sm_90a's cubins may be new under its old manifest, which a load refuses"), said
    assert "keep their previous files (each arch" not in said
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no staged copy left


def test_a_signal_during_a_compile_in_this_process_ends_the_build_after_it(monkeypatch):
    """With --jobs 1 the variants compile in this process, and a SIGTERM's handler (or Ctrl-C's) raised its exception
    inside CuTe DSL's compiler, which calls back into Python: the exception crossed C++ frames, aborting the process
    through terminate or coming out as the compiler's RuntimeError, with --check's temporary build left behind. The
    signal is now held through each compile and ends the build after it (the compile here stands in for CuTe DSL's:
    it turns any exception raised inside it into a RuntimeError, as the compiler's callback boundary does)."""
    import signal
    import types

    import build_kernels

    compiled = []

    def compile_one(family, name, arch):
        try:
            signal.raise_signal(signal.SIGTERM)
            for _ in range(100):  # the handler would run between these bytecodes
                time.sleep(0.001)
        except BaseException as e:
            raise RuntimeError(f"Exception raised in callback: {e!r}") from e
        compiled.append(name)
        return name, arch, b"cubin", 0.1

    monkeypatch.setattr(build_kernels, "_compile_one", compile_one)
    variants = {"sm_90a": [types.SimpleNamespace(family="probe", name=n) for n in ("a", "b")]}
    with pytest.raises(SystemExit) as stop, build_kernels._sigterm_as_exit():
        build_kernels.compile_all(variants, jobs=1)
    assert stop.value.code == 128 + signal.SIGTERM
    assert compiled == ["a"]  # the first compile finished; the build ended before the second


def test_check_with_a_compile_setting_set_warns_and_says_to_unset_it():
    """--check with a CuTe DSL compile setting exported said nothing of it, failed the current cache on the toolchain
    and every cubin's sha256, and told to rebuild: a rebuild with the setting still set writes a measurement cache,
    which the runtime refuses and the next check fails again. It now warns first and says to unset it."""
    import os

    env = {**os.environ, "CUTE_DSL_LINEINFO": "1"}
    proc = subprocess.run(BUILD + ["--check", "--arch", "sm_90a", "--only", "empty"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("warning: CUTE_DSL_LINEINFO=1 set: this is a measurement build")
    assert proc.stdout.rstrip().splitlines()[-1].endswith(
        "this check's build ran with CUTE_DSL_LINEINFO set, which its manifests record: unset it and check again")
    assert "python build_kernels.py" not in proc.stdout


def test_an_out_whose_name_is_no_utf8_is_built_whole(tmp_path):
    """An --out whose name is no UTF-8 (Python keeps its bytes as surrogates), printed in the "wrote" line under a
    strict UTF-8 stdout (a UTF-8 locale other than C's), raised UnicodeEncodeError after the first arch was written:
    exit 1, the second arch not built, the stale-file cleanup skipped. The name is printed escaped."""
    import os

    out = os.fsencode(str(tmp_path)) + b"/cache\xff"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([*map(os.fsencode, BUILD), b"--only", b"empty", b"--out", out], capture_output=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")
    assert b"wrote " + os.fsencode(str(tmp_path)) + b"/cache\\udcff/manifests/sm_100a.json" in proc.stdout
    for arch in ("sm_90a", "sm_100a"):
        assert check_cache(Path(os.fsdecode(out)), arch).kernels


def test_check_runs_the_loads_cubin_checks(tmp_path):
    """--check compared the committed cubins' bytes through any symlink, and passed a cubin linked from outside the
    cache root, which every load refuses: it now runs every CPU-side check of a load on the committed cache."""
    import os
    import shutil

    from crafted_cache import copy_probe_cache, first_cubin

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    cubin = first_cubin(committed)
    outside = tmp_path / "elsewhere.cubin"
    shutil.move(cubin, outside)
    os.symlink(outside, cubin)
    with pytest.raises(errors.PathError):
        check_cache(committed, "sm_90a")
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert len(problems) == 1 and "sm_90a: the runtime refuses the committed manifest" in problems[0], problems


def test_check_names_files_no_manifest_entry_names(tmp_path):
    """--check compared only what the manifests name: a cubin left from a variant the sources dropped, or a killed
    build's staged copy, passed, and a plain install shipped it. Each such file is now one problem line."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    folder = committed / "cubins" / "sm_90a"
    (folder / "probe_gone.cubin").write_bytes(b"\x7fELF")
    (folder / ".probe_cluster2.cubin.k1ll3d").write_bytes(b"")
    (committed / "manifests" / ".sm_100a.json.k1ll3d").write_bytes(b"{")  # a killed build's staged manifest
    problems = build_kernels.check_against(committed, fresh, ["sm_90a", "sm_100a"], ("probe",))
    why = ("in the committed cache, named by no manifest entry (a variant the sources no longer define, or a "
           "killed build's temporary file)")
    assert problems == [f"sm_90a cubins/sm_90a/.probe_cluster2.cubin.k1ll3d: {why}",
                        f"sm_90a cubins/sm_90a/probe_gone.cubin: {why}",
                        f"sm_100a manifests/.sm_100a.json.k1ll3d: {why}"], problems


def test_a_build_leaves_only_the_cubins_its_manifest_names(tmp_path, monkeypatch, capsys):
    """A build removes, under its lock and after the manifest is in place, every file of the arch's cubin folder
    that the new manifest does not name; it names each. A folder there is left, with a warning naming it."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    variants = all_variants("sm_90a", ("probe",))
    folder = cache / "cubins" / "sm_90a"
    cubins = {(v.name, "sm_90a"): (folder / f"{v.name}.cubin").read_bytes() for v in variants}
    other_arch = sorted(p.name for p in (cache / "cubins" / "sm_100a").iterdir())
    (folder / "probe_gone.cubin").write_bytes(b"\x7fELF")
    (folder / ".probe_cluster2.cubin.k1ll3d").write_bytes(b"")
    (folder / "notes").mkdir()
    staged_manifest = cache / "manifests" / ".sm_90a.json.k1ll3d"  # a killed build's, staged beside the manifest
    staged_manifest.write_bytes(b"{")
    other_staged_manifest = cache / "manifests" / ".sm_100a.json.k1ll3d"  # of an arch not built: left to its build
    other_staged_manifest.write_bytes(b"{")
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{v.name}.cubin" for v in variants] + ["notes"])
    assert not staged_manifest.exists() and other_staged_manifest.exists()
    assert sorted(p.name for p in (cache / "cubins" / "sm_100a").iterdir()) == other_arch  # not built: untouched
    out, err = capsys.readouterr()
    assert f"removed {folder / 'probe_gone.cubin'}" in out and f"removed {folder / '.probe_cluster2.cubin.k1ll3d'}" in out
    assert f"removed {staged_manifest}" in out
    assert f"warning: left {folder / 'notes'}" in err
    check_cache(cache, "sm_90a")


def _copy_an_empty_kernel(cache) -> dict:
    """The committed manifest entry of an ``empty`` family kernel (sm_90a), its cubin copied into ``cache``: an entry
    of another family than the probes, which a ``--only probe`` build keeps."""
    import shutil

    committed = json.loads(manifest_path(REPO, "sm_90a").read_text())
    empty = next(e for e in committed["kernels"] if e["family"] == "empty")
    shutil.copy(REPO / empty["cubin"], cache / empty["cubin"])
    return empty


def _the_committed_toolchain() -> dict:
    """The committed manifest's toolchain, as a stubbed ``toolchain_info`` for a partial build that keeps entries
    (it refuses to keep entries of another toolchain)."""
    return json.loads(manifest_path(REPO, "sm_90a").read_text())["toolchain"]


def test_a_build_keeps_a_cubin_named_by_a_path_the_runtime_reads_alike(tmp_path, monkeypatch):
    """A kept entry (another family, --only) may name its cubin "cubins/sm_90a/./x.cubin", which the runtime reads as
    "cubins/sm_90a/x.cubin": the build's clean-up compares normalised paths, so it keeps that file."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    cache = copy_probe_cache(tmp_path)
    empty = _copy_an_empty_kernel(cache)
    path = manifest_path(cache, "sm_90a")
    data = json.loads(path.read_text())
    data["kernels"].append(dict(empty, cubin=empty["cubin"].replace("sm_90a/", "sm_90a/./")))
    path.write_text(json.dumps(data))
    variants = all_variants("sm_90a", ("probe",))
    folder = cache / "cubins" / "sm_90a"
    cubins = {(v.name, "sm_90a"): (folder / f"{v.name}.cubin").read_bytes() for v in variants}
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert (cache / empty["cubin"]).is_file()
    assert empty["name"] in check_cache(cache, "sm_90a").kernels


def test_written_cache_files_are_readable_by_other_accounts(tmp_path):
    """The build's atomic writes (tempfile.mkstemp, 0600) left every cubin and manifest readable by its builder
    alone: a cache built as root in an image, or into a shared --out, was refused to the serving account
    (CubinIntegrityError: Permission denied). They get the mode a plain write would (0666 less the umask)."""
    import os
    import stat

    import build_kernels

    old = os.umask(0o022)
    build_kernels._plain_file_mode.cache_clear()  # read once a process: read it under this umask
    try:
        build_kernels._atomic_write(tmp_path / "cubins" / "sm_90a" / "x.cubin", b"cubin")
    finally:
        os.umask(old)
        build_kernels._plain_file_mode.cache_clear()
    assert stat.S_IMODE((tmp_path / "cubins" / "sm_90a" / "x.cubin").stat().st_mode) == 0o644


def test_atomic_writes_reach_the_disk_before_the_next_file(tmp_path, monkeypatch):
    """A write was renamed into place without an fsync: after a power loss the cubin could come back empty under
    a manifest naming it (every load then refused the cache). Each file's data is synced before its rename, and
    the rename (its directory) before the next file."""
    import os

    import build_kernels

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    for name in ("a.cubin", "sm_90a.json"):
        build_kernels._atomic_write(tmp_path / name, b"x")
    assert events == [("fsync", False), ("replace", "a.cubin"), ("fsync", True),
                      ("fsync", False), ("replace", "sm_90a.json"), ("fsync", True)], events
    assert (tmp_path / "a.cubin").read_bytes() == b"x"


def test_a_variant_refused_halfway_writes_nothing(tmp_path, monkeypatch):
    """write_cache checked each cubin against the contract just before writing it: a later variant refused (here an
    sm_100a cubin among the sm_90a ones) left the earlier variants' new cubins under the old manifest, whose sha256s
    every load then refused. Now every cubin is checked before any file is written."""
    from crafted_cache import copy_probe_cache, first_cubin

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    first, before = first_cubin(cache), first_cubin(cache).read_bytes()
    first_variant, second_variant = all_variants("sm_90a", ("probe",))
    cubins = {(first_variant.name, "sm_90a"): before + b"\0" * 16,  # a new build of it: another sha256
              (second_variant.name, "sm_90a"): first_cubin(cache, "sm_100a").read_bytes()}
    with pytest.raises(SystemExit, match=f"{second_variant.name}: compiled for sm_100a"):
        build_kernels.write_cache(cache, {"sm_90a": [first_variant, second_variant]}, cubins, ("probe",))
    assert first.read_bytes() == before
    check_cache(cache, "sm_90a")


def _cache_files(cache) -> dict:
    """Every file of the cache and its bytes, the build's lock file (which a write creates) left out."""
    return {p: p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file() and p.name != BUILD_LOCK}


def test_a_manifest_the_runtime_would_refuse_is_not_written(tmp_path, monkeypatch):
    """The build wrote its manifest without reading it back as the runtime does: a contract config value that JSON
    changes (a tuple, read back as a list) built "successfully", and every load then refused the entry as differing
    from the contract. The runtime's reader now runs over each manifest before any file of the build is written."""
    import dataclasses

    from crafted_cache import copy_probe_cache

    import build_kernels
    from runtime import manifest as runtime_manifest

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    before = _cache_files(cache)
    variants, cubins = _probe_cubins(cache)
    tupled = [dataclasses.replace(v, config=(*v.config, ("tile", (64, 2)))) for v in variants]
    monkeypatch.setattr(runtime_manifest, "all_variants", lambda arch, families=None: tupled)
    monkeypatch.setattr(build_kernels, "all_variants", lambda arch, families=None: tupled)
    with pytest.raises(SystemExit, match=r"^the manifest this build would write for sm_90a is refused by the "
                                         r"runtime's reader, so no file was written: .*differs from this runtime's "
                                         r"contract in config"):
        build_kernels.write_cache(cache, {"sm_90a": tupled}, cubins, ("probe",))
    assert _cache_files(cache) == before


def test_the_build_checks_each_new_cubin_as_a_load_does(tmp_path, monkeypatch):
    """A new cubin whose ELF disagrees with its entry where a load looks past the sha256 (here its parameter list
    cut from the manifest's entry by one) is refused before any file is written."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})
    cache = copy_probe_cache(tmp_path)
    before = _cache_files(cache)
    variants, cubins = _probe_cubins(cache)
    manifest_entry = build_kernels.manifest_entry

    def shifted(variant, arch, cubin):
        entry = manifest_entry(variant, arch, cubin)
        entry["params"][0]["offset"] += 8
        return entry

    monkeypatch.setattr(build_kernels, "manifest_entry", shifted)
    with pytest.raises(SystemExit, match=r"refused by the runtime's reader, so no file was written: .*parameters "
                                         r"\(offset, size\)"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert _cache_files(cache) == before


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(kernels=5), "manifest has no list of kernels"),
    (lambda d: d["kernels"].append(5), "manifest entry lacks name"),
    (lambda d: d["kernels"][0].pop("name"), "manifest entry lacks name"),
    (lambda d: d["kernels"][0].update(name=["probe_cluster2"]), "fields name must be strings"),
])
def test_check_reports_a_committed_manifest_it_cannot_compare(tmp_path, edit, match):
    """A committed manifest whose kernels are not a list of named objects crashed --check (TypeError, KeyError) with a
    traceback instead of its CHECK FAILED line; now the line gives the runtime's reason."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    edit_manifest(committed, "sm_90a", edit)
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert len(problems) == 1 and problems[0].startswith("sm_90a: the runtime refuses the committed manifest")
    assert re.search(match, problems[0]), problems


def test_check_reports_a_committed_manifest_that_is_not_an_object(tmp_path):
    from crafted_cache import copy_probe_cache

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    manifest_path(committed, "sm_90a").write_text("[]")
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert len(problems) == 1 and "manifest is an array, not a JSON object" in problems[0], problems


def test_check_names_a_toolchain_field_held_as_null_against_an_absent_one(tmp_path):
    """null on one side and no key on the other differ, but .get() read both as None: "toolchain differs ... ()"."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    assert "build_switches" not in json.loads(manifest_path(fresh, "sm_90a").read_text())["toolchain"]
    edit_manifest(committed, "sm_90a", lambda d: d["toolchain"].update(build_switches=None))
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert [str(p) for p in problems] == ["sm_90a: toolchain differs from the committed build's (build_switches)"]


@pytest.mark.parametrize("damage", ["{not json", "[]", '{"schema": 0, "kernels": []}', "KERNELS_NOT_OBJECTS"])
def test_partial_build_refuses_a_previous_manifest_it_cannot_read(tmp_path, damage):
    """--only keeps the other families' entries from the manifest it replaces. One it could not read made it write a
    manifest of the rebuilt family alone (every op of the others then took its fallback), and entries that are not
    objects crashed it after its cubins were written. It now stops before writing anything, naming the manifest."""
    import shutil

    shutil.copytree(REPO / "cubins", tmp_path / "cubins")
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    path = manifest_path(tmp_path, "sm_90a")
    if damage == "KERNELS_NOT_OBJECTS":
        data = json.loads(path.read_text())
        data["kernels"] = ["probe_cluster2"]
        damage = json.dumps(data)
    path.write_text(damage)
    cubin = tmp_path / json.loads(manifest_path(REPO, "sm_90a").read_text())["kernels"][0]["cubin"]
    cubin.write_bytes(b"left as it was")
    proc = subprocess.run(BUILD + ["--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode != 0 and "--only keeps the other families' entries" in proc.stderr, proc.stdout + proc.stderr
    assert path.read_text() == damage and cubin.read_bytes() == b"left as it was", "written before the refusal"


# --- fifty-first session review: what a build may not leave behind ---------------------------------------------------

def _probe_cubins(cache):
    variants = all_variants("sm_90a", ("probe",))
    folder = cache / "cubins" / "sm_90a"
    return variants, {(v.name, "sm_90a"): (folder / f"{v.name}.cubin").read_bytes() for v in variants}


def test_a_measurement_build_is_recorded_and_refused_by_the_runtime(tmp_path):
    """A build with a kernel's measurement switch set (SPARSE_MLA_EXPERIMENT=skip_pv leaves out the second product)
    or a CuTe DSL compile setting made cubins the runtime loaded as the op's, with the same manifest as a clean build.
    The build now says so before compiling, the manifest records the switches, and the runtime refuses the cache
    unless a measurement asks for it."""
    import os

    env = {**os.environ, "SPARSE_MLA_EXPERIMENT": "timeline", "CUTE_DSL_LINEINFO": "1"}
    proc = subprocess.run(BUILD + ["--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning: SPARSE_MLA_EXPERIMENT=timeline, CUTE_DSL_LINEINFO=1 set: this is a measurement build" in proc.stderr
    recorded = json.loads(manifest_path(tmp_path, "sm_90a").read_text())["toolchain"]["build_switches"]
    assert recorded == {"SPARSE_MLA_EXPERIMENT": "timeline", "CUTE_DSL_LINEINFO": "1"}
    with pytest.raises(errors.MeasurementBuildError, match="built with SPARSE_MLA_EXPERIMENT=timeline, "
                                                           "CUTE_DSL_LINEINFO=1 set.*SPARSE_DECODE_AOT_ALLOW"):
        check_cache(tmp_path, "sm_90a")


def test_a_measurement_cache_loads_only_where_asked(tmp_path, monkeypatch):
    from crafted_cache import copy_probe_cache, edit_manifest

    cache = copy_probe_cache(tmp_path)
    check_cache(cache, "sm_90a")
    edit_manifest(cache, "sm_90a", lambda d: d["toolchain"].update(build_switches={"DECODE_TOPK_EXPERIMENT": "x"}))
    with pytest.raises(errors.MeasurementBuildError, match="DECODE_TOPK_EXPERIMENT=x"):
        check_cache(cache, "sm_90a")
    monkeypatch.setenv("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD", "0")  # only "1" asks for it
    with pytest.raises(errors.MeasurementBuildError, match="DECODE_TOPK_EXPERIMENT=x"):
        check_cache(cache, "sm_90a")
    monkeypatch.setenv("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD", "1")
    check_cache(cache, "sm_90a")
    monkeypatch.delenv("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD")
    edit_manifest(cache, "sm_90a", lambda d: d["toolchain"].update(build_switches={}))  # a hand edit: still refused,
    with pytest.raises(errors.MeasurementBuildError, match="built with an empty toolchain.build_switches"):  # named
        check_cache(cache, "sm_90a")


def test_the_recorded_switches_are_every_variable_the_kernels_read():
    """Each kernel module reads its measurement switch by the name kernels.compile records; a variable read under
    another name would change cubins without the manifest saying so. CuTe DSL's compile settings are taken from its
    own declarations."""
    from kernels import compile as kc

    read = set()
    for path in (REPO / "kernels").rglob("*.py"):
        text = path.read_text()
        literal = re.search(r"os\.(environ\.get\(|getenv\(|environ\[)\s*[\"']", text)
        assert not literal, f"{path}: reads a variable by a literal name"
        if path.name != "compile.py":  # the recorder itself reads every name it records
            read |= set(re.findall(r"os\.environ\.get\((\w+)", text))
    assert read == {"DECODE_TOPK_SWITCH", "SPARSE_MLA_SWITCH"}
    assert set(kc.MEASUREMENT_SWITCHES) == {kc.DECODE_TOPK_SWITCH, kc.SPARSE_MLA_SWITCH}
    dsl = kc._compile_affecting_dsl_variables()
    assert {"CUTE_DSL_LINEINFO", "CUTE_DSL_COMPILER_OPT", "CUTE_DSL_DEBUG"} <= set(dsl)
    assert "CUTE_DSL_LOG_LEVEL" not in dsl  # declared as not changing what it compiles


def test_a_symlinked_cubin_folder_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Through a symlinked cubins/ the build wrote into, and removed the other files of, another cache outside its
    lock (38 cubins of it in the reviewer's run), and left a cache its own runtime refuses."""
    import os

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    other = copy_probe_cache(tmp_path / "other")
    before = sorted(p.name for p in (other / "cubins" / "sm_90a").iterdir())
    (other / "cubins" / "sm_90a" / "unrelated.cubin").write_bytes(b"x")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(other / "cubins", cache / "cubins")
    variants, cubins = _probe_cubins(other)
    with pytest.raises(SystemExit, match=r"cubins: a symlink .*replace it with a directory"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert sorted(p.name for p in (other / "cubins" / "sm_90a").iterdir()) == sorted(before + ["unrelated.cubin"])
    assert not (cache / "manifests").exists()
    proc = subprocess.run(BUILD + ["--only", "probe", "--out", str(cache)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode != 0 and "a symlink" in proc.stderr and "compiled" not in proc.stdout


@pytest.mark.parametrize("where, make", [("manifests", "file"), ("cubins", "file"), ("cubins/sm_90a", "file"),
                                         ("manifests/sm_90a.json", "dir"),
                                         ("cubins/sm_90a/probe_cluster2.cubin", "dir")])
def test_a_file_or_folder_in_the_builds_way_is_refused_before_compiling(tmp_path, where, make):
    """An --out whose manifests/ or cubins/<arch>/ was a file, or whose manifest or cubin path was a folder, failed
    after every compile with a bare traceback (FileExistsError, IsADirectoryError; with --only, a refusal whose fix,
    a whole build, crashed the same way): now refused before compiling, naming the path and the fix."""
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if make == "dir" else path.write_text("")
    proc = subprocess.run(BUILD + ["--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "compiled" not in proc.stdout, proc.stdout + proc.stderr
    assert f"{path}: " in proc.stderr and "remove it, or build with another --out" in proc.stderr, proc.stderr


def test_a_partial_build_refuses_kept_entries_the_runtime_would_refuse(tmp_path, monkeypatch):
    """--only kept the other families' entries as they were: one the contract has changed under since (here its
    smem_bytes), or whose cubin no longer matches, was written into the new manifest, and the runtime then refused
    the whole arch, the family just rebuilt with it. The build now stops before writing anything."""
    import shutil

    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    cache = copy_probe_cache(tmp_path)
    empty = _copy_an_empty_kernel(cache)
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"].append(dict(empty, smem_bytes=empty["smem_bytes"] + 16)))
    variants, cubins = _probe_cubins(cache)
    new_cubins = {key: data + b"\0" * 16 for key, data in cubins.items()}
    manifest_before = manifest_path(cache, "sm_90a").read_bytes()
    with pytest.raises(SystemExit, match=rf"--only keeps .*{empty['name']}.*smem_bytes.*build every family"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, new_cubins, ("probe",))
    assert manifest_path(cache, "sm_90a").read_bytes() == manifest_before
    assert _probe_cubins(cache)[1] == cubins  # no cubin replaced
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][-1].update(smem_bytes=empty["smem_bytes"]))
    (cache / empty["cubin"]).write_bytes(b"\0" + (REPO / empty["cubin"]).read_bytes()[1:])  # its bytes changed
    with pytest.raises(SystemExit, match=rf"--only keeps .*{empty['name']}"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, new_cubins, ("probe",))
    shutil.copy(REPO / empty["cubin"], cache / empty["cubin"])
    build_kernels.write_cache(cache, {"sm_90a": variants}, new_cubins, ("probe",))
    assert empty["name"] in check_cache(cache, "sm_90a").kernels


def test_a_partial_build_refuses_a_contract_kernel_filed_under_an_unknown_family(tmp_path, monkeypatch):
    """An entry of a contract kernel whose family a hand edit changed to one the contract does not know was dropped
    as a retired family's: --only wrote a manifest without it, removed its cubin and exited 0."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    cache = copy_probe_cache(tmp_path)
    empty = _copy_an_empty_kernel(cache)
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"].append(dict(empty, family="emptyy")))
    variants, cubins = _probe_cubins(cache)
    manifest_before = manifest_path(cache, "sm_90a").read_bytes()
    with pytest.raises(SystemExit, match=rf"entry '{empty['name']}' is filed under family 'emptyy'.*a 'empty' "
                                         rf"kernel.*build every family"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert manifest_path(cache, "sm_90a").read_bytes() == manifest_before
    assert (cache / empty["cubin"]).exists()
    # A misfiled variant of a family rebuilt now is written afresh under its own name: no refusal
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"].pop())
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(family="probee"))
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    written = json.loads(manifest_path(cache, "sm_90a").read_text())["kernels"]
    assert [(e["name"], e["family"]) for e in written if e["name"].startswith("probe")] == \
        [(v.name, "probe") for v in variants]


def test_out_paths_that_cannot_be_looked_up_are_refused_with_the_reason(tmp_path):
    """Path.exists() raised for a name too long (a traceback); a dangling symlink said mkdir's "File exists"; --check
    of a root whose manifests/ is a file said to build a cache there, which the build then refused."""
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "manifests").write_text("")
    for args, match in ((["--out", str(tmp_path / ("a" * 300))], "cannot be looked up (File name too long)"),
                        (["--check", "--out", str(tmp_path / ("a" * 300))], "cannot be looked up (File name too long)"),
                        (["--out", str(dangling)], f"a symlink to {tmp_path / 'nowhere'}, which leads to no directory"),
                        (["--check", "--arch", "sm_90a", "--out", str(blocked)],
                         "cannot look up {} (Not a directory)".format(manifest_path(blocked, "sm_90a")))):
        proc = subprocess.run(BUILD + ["--only", "probe", *args], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2 and match in proc.stderr, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "compiled" not in proc.stdout


def test_a_partial_build_over_a_measurement_build_keeps_its_switches(tmp_path, monkeypatch):
    """Entries kept from a measurement build stay measurement entries: the new manifest keeps their switches
    recorded (beside the clean build's none), so the runtime goes on refusing the cache."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    monkeypatch.setenv("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD", "1")  # the kept entries are read as a load would
    cache = copy_probe_cache(tmp_path)
    empty = _copy_an_empty_kernel(cache)

    def measured(d):
        d["kernels"].append(empty)
        d["toolchain"]["build_switches"] = {"DECODE_TOPK_EXPERIMENT": "timeline"}

    edit_manifest(cache, "sm_90a", measured)
    variants, cubins = _probe_cubins(cache)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    toolchain = json.loads(manifest_path(cache, "sm_90a").read_text())["toolchain"]
    assert toolchain == {**_the_committed_toolchain(), "build_switches": {"DECODE_TOPK_EXPERIMENT": "timeline"}}


def test_a_partial_build_refuses_kept_entries_of_another_toolchain(tmp_path, monkeypatch):
    """A manifest records one toolchain for all its cubins: --only over entries another toolchain compiled stamped
    them with this build's. It is refused before anything is written, naming what differs; a build that keeps
    nothing (here: of the probes alone) is a whole cache of this toolchain and goes on."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    newer = {**_the_committed_toolchain(), "nvidia-cutlass-dsl": "99.0"}
    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: newer)
    cache = copy_probe_cache(tmp_path)
    variants, cubins = _probe_cubins(cache)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))  # keeps nothing
    assert json.loads(manifest_path(cache, "sm_90a").read_text())["toolchain"] == newer
    empty = _copy_an_empty_kernel(cache)
    edit_manifest(cache, "sm_90a", lambda d: (d["kernels"].append(empty),
                                              d.update(toolchain=_the_committed_toolchain())))
    manifest_before = manifest_path(cache, "sm_90a").read_bytes()
    with pytest.raises(SystemExit, match=r"--only keeps .*another toolchain compiled \(nvidia-cutlass-dsl "
                                         r"'4[^']*' -> '99.0'\).*build every family"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert manifest_path(cache, "sm_90a").read_bytes() == manifest_before
    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert empty["name"] in check_cache(cache, "sm_90a").kernels


def test_sources_edited_during_the_build_stop_it(tmp_path, monkeypatch):
    """The source hash was taken after the minutes of compiling: an edit or checkout in between stamped cubins of
    the earlier sources with the new ones. The build takes it before and refuses to write where it changed."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})
    cache = copy_probe_cache(tmp_path)
    manifest_before = manifest_path(cache, "sm_90a").read_bytes()
    variants, cubins = _probe_cubins(cache)
    with pytest.raises(SystemExit, match="sources changed while the cubins compiled"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",), sources="0" * 64)
    assert manifest_path(cache, "sm_90a").read_bytes() == manifest_before
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",), sources=build_kernels.source_hash())


def test_a_failed_compile_ends_a_parallel_build_at_once():
    """With --jobs above 1 a failed compile surfaced only after every queued variant had compiled (the executor's
    shutdown waited for them: about a whole build's time), and a SIGTERM to the build left its workers waiting
    forever. The first failure ends the build and its workers."""
    code = ("import dataclasses, build_kernels\n"
            "from runtime.contract import all_variants\n"
            "bogus = dataclasses.replace(all_variants('sm_90a')[0], name='no_such_variant')\n"
            "build_kernels.compile_all({'sm_90a': [bogus, *all_variants('sm_90a')], "
            "'sm_100a': all_variants('sm_100a')}, 2)\n")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                          check=False)
    took = time.perf_counter() - start
    assert proc.returncode != 0 and "LookupError: probe has no variant 'no_such_variant'" in proc.stderr, proc.stderr
    assert took < 45, f"{took:.0f} s: the build went on compiling (every variant takes over a minute on two workers)"


def test_a_compile_worker_that_dies_stops_a_parallel_build(tmp_path):
    """A worker killed mid-compile (the OOM killer, a crash in the compiler) was replaced by the Pool, which lost its
    task: the build waited for that result forever, and a SIGTERM did not end it. The death now stops the build."""
    import os

    (tmp_path / "dying_worker.py").write_text(
        "import os, signal, time\n"
        "def compile_task(task):\n"
        "    if task[1] == 'probe_cluster2':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    time.sleep(0.5)\n"
        "    return task[1], task[2], b'cubin', 0.5\n")
    code = ("import build_kernels, dying_worker\n"
            "from runtime.contract import all_variants\n"
            "build_kernels._compile_task = dying_worker.compile_task  # what the spawned workers run, by name\n"
            "build_kernels.compile_all({'sm_90a': all_variants('sm_90a', ('probe',))}, 2)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the build waited forever for the variant of a worker that died")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "a compile worker (pid " in proc.stderr and "died with exit code -9" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_arch_given_twice_builds_both(tmp_path, monkeypatch):
    """--arch sm_90a --arch sm_100a kept the last one only: sm_90a dropped without a word (and a --check of it passed
    without looking)."""
    import build_kernels

    asked = []

    def stop(variants_by_arch, jobs):
        asked.append(list(variants_by_arch))
        raise SystemExit(0)

    monkeypatch.setattr(build_kernels, "compile_all", stop)
    with pytest.raises(SystemExit):
        build_kernels.main(["--arch", "sm_90a", "--arch", "sm_100a", "sm_90a", "--only", "probe", "--out",
                            str(tmp_path)])
    assert asked == [["sm_90a", "sm_100a"]]


def test_only_given_twice_builds_the_family_once(tmp_path, monkeypatch):
    """--only probe --only probe ended in a traceback, all_variants' "duplicate kernel names in the contract" (the
    contract was fine); --arch given twice was already taken once."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    copy_probe_cache(tmp_path, archs=("sm_90a",))  # a cache to check: a folder without one is refused first
    asked = []

    def stop(variants_by_arch, jobs):
        asked.append({arch: [v.name for v in vs] for arch, vs in variants_by_arch.items()})
        raise SystemExit(0)

    monkeypatch.setattr(build_kernels, "compile_all", stop)
    for extra in ([], ["--check"]):
        with pytest.raises(SystemExit):
            build_kernels.main(["--only", "probe", "--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path),
                                *extra])
    assert asked == [{"sm_90a": [v.name for v in all_variants("sm_90a", ("probe",))]}] * 2


def test_failed_check_names_the_checked_cache_in_its_fix(tmp_path, monkeypatch, capsys):
    """The fix a failed --check printed left --out out: run as said, it rebuilt this checkout's cache, not the one
    checked, and the check kept failing."""
    from crafted_cache import copy_probe_cache

    import build_kernels

    copy_probe_cache(tmp_path, archs=("sm_90a",))  # a cache to check: a folder without one is refused first
    monkeypatch.setattr(build_kernels, "compile_all", lambda variants_by_arch, jobs: {})
    monkeypatch.setattr(build_kernels, "write_cache", lambda *args, **kwargs: None)
    monkeypatch.setattr(build_kernels, "check_against", lambda *args: ["a difference"])
    assert build_kernels.main(["--check", "--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path)]) == 1
    assert f"run: python build_kernels.py --arch sm_90a --out {tmp_path}" in capsys.readouterr().out


@pytest.mark.parametrize("where, edit, fix", [
    ("committed", lambda d: d["kernels"][0].update(sha256="0" * 64),
     "run: python build_kernels.py --arch sm_90a --out {out} --only probe"),
    ("fresh", lambda d: d.update(source_hash="f" * 64),
     ("--only cannot mend a manifest's source stamp, toolchain or form, or an entry it keeps; run: python "
      "build_kernels.py --arch sm_90a --out {out}")),
], ids=["an entry of the family checked", "the source stamp"])
def test_failed_check_with_only_names_the_build_that_mends_it(tmp_path, monkeypatch, capsys, where, edit, fix):
    """The fix a failed --check --only printed left --only out: run as said, it rebuilt every family, not the ones
    checked. It now carries the check's --only (each once), but not where the problem is the manifest's source stamp
    (or its toolchain, or the manifest itself): a build of some families keeps the stamp of the entries it keeps
    (test_partial_build_keeps_the_manifest_order_and_the_source_stamp), and the check would fail again after it."""
    import shutil

    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    caches = {"committed": copy_probe_cache(tmp_path / "committed"), "fresh": copy_probe_cache(tmp_path / "fresh")}
    edit_manifest(caches[where], "sm_90a", edit)
    monkeypatch.setattr(build_kernels, "compile_all", lambda variants_by_arch, jobs: {})
    monkeypatch.setattr(build_kernels, "write_cache",  # the fresh build: the crafted copy, no CuTe DSL compile
                        lambda out, *args, **kwargs: shutil.copytree(caches["fresh"], out, dirs_exist_ok=True))
    out = caches["committed"]
    assert build_kernels.main(["--check", "--only", "probe", "--only", "probe", "--arch", "sm_90a", "--out",
                               str(out)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"check failed: 1 difference(s); {fix.format(out=out)}"


# --- sixty-fourth session review (review-64a): mutation audit of the build side ---------------------------------------

def test_the_source_hash_covers_file_names_and_the_contract(tmp_path, monkeypatch):
    """--check and the manifest's source_hash stand for the kernel sources and the contract: a renamed kernel module,
    or an edit to runtime/contract alone, changed the cubins' meaning without changing the stamp, had the hash left
    either out. Files other than Python sources are not part of it."""
    import build_kernels

    (tmp_path / "kernels").mkdir()
    (tmp_path / "runtime" / "contract").mkdir(parents=True)
    (tmp_path / "kernels" / "a.py").write_text("A = 1\n")
    (tmp_path / "runtime" / "contract" / "c.py").write_text("C = 1\n")
    monkeypatch.setattr(build_kernels, "REPO", tmp_path)
    seen = [build_kernels.source_hash()]
    (tmp_path / "kernels" / "notes.txt").write_text("not a source")
    assert build_kernels.source_hash() == seen[0]
    (tmp_path / "kernels" / "a.py").rename(tmp_path / "kernels" / "b.py")
    seen.append(build_kernels.source_hash())
    (tmp_path / "runtime" / "contract" / "c.py").write_text("C = 2\n")
    seen.append(build_kernels.source_hash())
    assert len(set(seen)) == 3, "a rename or a contract edit left the source hash as it was"


def _a_probe_cubin():
    """The committed cache's first probe variant of sm_90a and its cubin."""
    variants, cubins = _probe_cubins(REPO)
    return variants[0], cubins[(variants[0].name, "sm_90a")]


def test_a_cubin_without_a_kernel_is_refused_by_name(monkeypatch):
    """manifest_entry takes the cubin's one kernel: a cubin of none is refused with the variant's name, not a bare
    ValueError from unpacking (or a manifest entry made of nothing)."""
    import types

    import build_kernels

    variant, cubin = _a_probe_cubin()
    monkeypatch.setattr(build_kernels, "read_cubin",
                        lambda data: types.SimpleNamespace(arch="sm_90a", arch_matches=lambda arch: True, kernels={}))
    with pytest.raises(SystemExit, match=rf"{variant.name} \(sm_90a\): expected one kernel in the cubin, found \[\]"):
        build_kernels.manifest_entry(variant, "sm_90a", cubin)


def test_a_cubin_compiled_for_another_block_shape_is_refused(monkeypatch):
    """A kernel compiled for other blocks than the contract's threads (its EIATTR_REQNTID) is refused at the build:
    the driver would refuse each of its launches."""
    import types

    import build_kernels

    variant, cubin = _a_probe_cubin()
    build_kernels.manifest_entry(variant, "sm_90a", cubin)  # as compiled
    wider = (variant.threads * 2, 1, 1)
    monkeypatch.setattr(build_kernels, "kernel_attributes",
                        lambda data, symbol: types.SimpleNamespace(required_block=wider))
    with pytest.raises(SystemExit, match=rf"compiled for blocks of \[{wider[0]}, 1, 1\] threads, the contract "
                                         rf"launches \[{variant.threads}, 1, 1\]"):
        build_kernels.manifest_entry(variant, "sm_90a", cubin)


def test_written_cache_files_take_the_umask_of_the_build(tmp_path):
    """The mode is 0666 less the umask, not a fixed 0644: a group-writable umask (0002, a shared build folder) gives
    0664, as a plain write would."""
    import os
    import stat

    import build_kernels

    old = os.umask(0o002)
    build_kernels._plain_file_mode.cache_clear()
    try:
        build_kernels._atomic_write(tmp_path / "x.cubin", b"cubin")
    finally:
        os.umask(old)
        build_kernels._plain_file_mode.cache_clear()
    assert stat.S_IMODE((tmp_path / "x.cubin").stat().st_mode) == 0o664


def test_the_manifest_is_renamed_after_the_cubins_renames_are_on_disk(tmp_path, monkeypatch):
    """_atomic_write_all renames the cubins and syncs their folder before the manifest (``last``) is renamed: after a
    power loss the manifest never names a cubin whose rename did not land."""
    import os

    import build_kernels

    events = []
    real_replace, real_sync = os.replace, build_kernels._fsync_directory
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("replace", Path(dst).name)),
                                                          real_replace(src, dst)))
    monkeypatch.setattr(build_kernels, "_fsync_directory", lambda d: (events.append(("sync", d.name)), real_sync(d)))
    build_kernels._atomic_write_all([(tmp_path / "cubins" / "a.cubin", b"a"), (tmp_path / "cubins" / "b.cubin", b"b")],
                                    last=(tmp_path / "manifests" / "sm_90a.json", b"{}"))
    assert events == [("replace", "a.cubin"), ("replace", "b.cubin"), ("sync", "cubins"),
                      ("replace", "sm_90a.json"), ("sync", "manifests")], events


def test_a_failed_folder_sync_raises_its_own_error_and_leaves_no_temporary(tmp_path, monkeypatch):
    """A folder sync that fails after the cubins' renames (an I/O error) is raised as it is: the clean-up skips the
    staged names already renamed, where unlinking them raised FileNotFoundError over the real error; the manifest,
    not yet renamed, is not written and its staged copy is removed."""
    import errno

    import build_kernels

    def failing_sync(directory):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(build_kernels, "_fsync_directory", failing_sync)
    with pytest.raises(OSError, match="Input/output error"):
        build_kernels._atomic_write_all([(tmp_path / "a.cubin", b"a")], last=(tmp_path / "m.json", b"{}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.cubin"]


def test_atomic_writes_leave_no_file_descriptor_open(tmp_path):
    """Each write opens its file and its folder (to sync them): a build of every variant would otherwise hold
    hundreds of descriptors until it ends."""
    import os

    import build_kernels

    before = len(os.listdir("/proc/self/fd"))
    for name in ("a.cubin", "b.cubin", "c.cubin"):
        build_kernels._atomic_write(tmp_path / name, b"x")
    assert len(os.listdir("/proc/self/fd")) == before


def test_sigterm_during_a_parallel_compile_exits_with_its_code_and_restores_the_handler():
    """Inside compile_all's pool block SIGTERM raises SystemExit(128 + 15), so the block's clean-up ends the workers
    and the exit status says which signal; the previous handler is back afterwards. Outside the main thread (a build
    run from a thread) no handler can be set, and the block runs as it is."""
    import signal
    import threading

    import build_kernels

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop, build_kernels._sigterm_as_exit():
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            time.sleep(0.001)
    assert stop.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    ran = []

    def in_a_thread():
        with build_kernels._sigterm_as_exit():
            ran.append(True)

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert ran == [True]


def test_a_parallel_compile_that_returns_too_few_results_stops_the_build(monkeypatch):
    """A pool's result iterator that ends early (next()'s StopIteration in a worker ends it silently) left variants
    out of the cubins write_cache then looked up: the count is checked."""
    import contextlib
    import types

    import build_kernels

    class FewerResults:
        def __init__(self, processes, initializer=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def imap_unordered(self, fn, tasks):
            _family, name, arch = tasks[0]
            results = iter([(name, arch, b"cubin", 0.0)])
            return types.SimpleNamespace(next=lambda timeout=None: next(results))  # as a Pool's IMapIterator

    monkeypatch.setattr(build_kernels, "get_context", lambda method: types.SimpleNamespace(Pool=FewerResults))
    monkeypatch.setattr(build_kernels, "_sigterm_as_exit", contextlib.nullcontext)
    with pytest.raises(SystemExit, match="the build compiled 1 of 2 variants"):
        build_kernels.compile_all({"sm_90a": all_variants("sm_90a", ("probe",))}, 2)


def test_a_whole_build_stamps_todays_sources_over_any_previous_manifest(tmp_path, monkeypatch):
    """A build of every family (as --check's fresh build) stamps today's sources and this toolchain alone, whatever
    manifest it replaces: one of an older stamp, one it cannot read (rewritten, not refused), and one of a
    measurement build (whose switches it does not keep: it keeps none of its entries)."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels
    from runtime.contract import FAMILIES

    tools = {"python": "3"}
    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: tools)
    monkeypatch.setenv("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD", "1")
    cache = copy_probe_cache(tmp_path)
    variants, cubins = _probe_cubins(cache)
    path = manifest_path(cache, "sm_90a")
    for damage in (lambda: edit_manifest(cache, "sm_90a", lambda d: d.update(source_hash="f" * 64)),
                   lambda: path.write_text("{not json"),
                   lambda: edit_manifest(cache, "sm_90a", lambda d: d["toolchain"].update(build_switches={"X": "1"}))):
        damage()
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, FAMILIES)
        data = json.loads(path.read_text())
        assert data["source_hash"] == build_kernels.source_hash() and data["toolchain"] == tools


def test_a_partial_build_that_keeps_nothing_drops_the_previous_switches_and_stamp(tmp_path, monkeypatch):
    """--only over a measurement build whose entries are all rebuilt keeps none of them: the clean cubins are not
    recorded as a measurement build's, and the manifest names today's sources, from which every entry now comes (the
    previous stamp made --check report the sources changed)."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    monkeypatch.setenv("SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD", "1")
    cache = copy_probe_cache(tmp_path)
    edit_manifest(cache, "sm_90a", lambda d: d["toolchain"].update(build_switches={"DECODE_TOPK_EXPERIMENT": "x"}))
    edit_manifest(cache, "sm_90a", lambda d: d.update(source_hash="0" * 64))
    variants, cubins = _probe_cubins(cache)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    written = json.loads(manifest_path(cache, "sm_90a").read_text())
    assert "build_switches" not in written["toolchain"]
    assert written["source_hash"] == build_kernels.source_hash()
    check_cache(cache, "sm_90a")


def test_kept_switches_of_another_form_stay_recorded_and_this_builds_win(monkeypatch):
    """_toolchain_with_kept_switches: switches a previous manifest recorded in another form than an object are kept
    as text (the runtime still refuses the cache); where both builds set one switch, this build's value is the one
    its new cubins were compiled with."""
    import build_kernels

    tools = {"python": "3", "build_switches": {"SPARSE_MLA_EXPERIMENT": "now"}}
    previous = {"toolchain": {"build_switches": {"SPARSE_MLA_EXPERIMENT": "then", "DECODE_TOPK_EXPERIMENT": "x"}}}
    assert build_kernels._toolchain_with_kept_switches(tools, previous)["build_switches"] == {
        "SPARSE_MLA_EXPERIMENT": "now", "DECODE_TOPK_EXPERIMENT": "x"}
    odd = {"toolchain": {"build_switches": ["DECODE_TOPK_EXPERIMENT"]}}
    assert build_kernels._toolchain_with_kept_switches({"python": "3"}, odd)["build_switches"] == {
        "previous build": "['DECODE_TOPK_EXPERIMENT']"}


def test_a_partial_build_drops_entries_of_families_the_sources_no_longer_define(tmp_path, monkeypatch):
    """--only keeps the other families' entries, but only of families the contract still has: an entry of a retired
    family would make the runtime refuse the whole arch (a kernel the contract does not know), and stopped the build.
    It is dropped, and its cubin removed with the other unnamed files."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    cache = copy_probe_cache(tmp_path)
    empty = _copy_an_empty_kernel(cache)
    retired = dict(empty, name="retired_kernel", family="retired", cubin="cubins/sm_90a/retired_kernel.cubin")
    (cache / retired["cubin"]).write_bytes((cache / empty["cubin"]).read_bytes())
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"].extend([empty, retired]))
    variants, cubins = _probe_cubins(cache)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert set(check_cache(cache, "sm_90a").kernels) == {v.name for v in variants} | {empty["name"]}
    assert not (cache / retired["cubin"]).exists()


def test_a_partial_build_does_not_check_the_entries_it_replaces(tmp_path, monkeypatch):
    """Only the kept entries are held to a load's checks: an old cubin of the family being rebuilt (here damaged)
    is what the build replaces, not a reason to stop it."""
    from crafted_cache import copy_probe_cache, edit_manifest, first_cubin

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", _the_committed_toolchain)
    cache = copy_probe_cache(tmp_path)
    empty = _copy_an_empty_kernel(cache)
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"].append(empty))
    variants, cubins = _probe_cubins(cache)
    first_cubin(cache).write_bytes(b"damaged")
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert set(check_cache(cache, "sm_90a").kernels) == {v.name for v in variants} | {empty["name"]}


def test_a_symlink_to_a_folder_among_the_cubins_is_removed_not_followed(tmp_path, monkeypatch):
    """The clean-up leaves a real folder in cubins/<arch>/ (with a warning) but removes a symlink there, even one to
    a folder, without touching what it points to."""
    import os

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})
    cache = copy_probe_cache(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.cubin").write_bytes(b"x")
    link = cache / "cubins" / "sm_90a" / "linked"
    os.symlink(elsewhere, link)
    variants, cubins = _probe_cubins(cache)
    build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert not os.path.lexists(link) and (elsewhere / "keep.cubin").read_bytes() == b"x"


@pytest.mark.parametrize("linked", ["manifests", "cubins/sm_90a"])
def test_a_symlinked_manifest_or_arch_folder_is_refused(tmp_path, monkeypatch, linked):
    """Not only cubins/ itself: the build writes manifests/ and each arch's cubins/<arch>/ (and removes files from
    the latter), so a symlink at either is refused before anything is written."""
    import os

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})
    other = copy_probe_cache(tmp_path / "other")
    cache = tmp_path / "cache"
    (cache / linked).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(other / linked, cache / linked)
    variants, cubins = _probe_cubins(other)
    with pytest.raises(SystemExit, match=rf"{linked}: a symlink"):
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))


def test_check_reports_a_missing_committed_manifest_or_cubin(tmp_path):
    """--check names what the committed cache lacks (an arch's manifest, a cubin, its whole cubin folder) in one
    line each, where a crash would have ended it with a traceback."""
    import shutil

    from crafted_cache import copy_probe_cache, first_cubin

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    manifest_path(committed, "sm_100a").unlink()
    problems = build_kernels.check_against(committed, fresh, ["sm_100a"], ("probe",))
    assert len(problems) == 1 and problems[0].startswith("sm_100a: committed manifest unreadable"), problems
    first_cubin(committed).unlink()
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert problems == ["sm_90a probe_cluster2: committed cubin missing"], problems
    shutil.rmtree(committed / "cubins" / "sm_90a")
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert problems == ["sm_90a probe_cluster2: committed cubin missing",
                        "sm_90a probe_cluster8: committed cubin missing"], problems


def test_check_names_a_committed_cubin_that_differs_from_its_manifest(tmp_path):
    """A committed cubin whose bytes are not those its manifest entry (equal to the fresh build's) names: the check's
    own line says which, not only the runtime's refusal of the whole arch."""
    from crafted_cache import copy_probe_cache, first_cubin

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    first_cubin(committed).write_bytes(first_cubin(committed).read_bytes() + b"\0")
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert problems == ["sm_90a probe_cluster2: committed cubin does not match its manifest"], problems


def test_check_names_a_committed_entry_of_no_family_the_sources_define(tmp_path):
    """An entry of a family the contract no longer has is named as not built from the sources, as one of a checked
    family is (the runtime refuses it too, but --only of any family should say which entry)."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    edit_manifest(committed, "sm_90a", lambda d: d["kernels"].append(dict(d["kernels"][0], name="old", family="gone")))
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert problems == ["sm_90a old: in the committed manifest but not built from the sources"], problems


def test_check_names_a_committed_build_of_other_sources(tmp_path):
    """A committed manifest stamped with other sources than the fresh build's (the kernels were edited and not
    rebuilt; every entry may still match where the edit changed no cubin) is a difference."""
    from crafted_cache import copy_probe_cache, edit_manifest

    import build_kernels

    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    edit_manifest(committed, "sm_90a", lambda d: d.update(source_hash="f" * 64))
    problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
    assert problems == ["sm_90a: kernel sources changed since the committed build (source_hash)"], problems


def _stop_at_compile(monkeypatch, asked):
    """compile_all stood in for: records what main asked for, and ends main there (no CuTe DSL compile)."""
    import build_kernels

    def stop(variants_by_arch, jobs):
        asked.append({arch: [v.name for v in vs] for arch, vs in variants_by_arch.items()})
        raise SystemExit(0)

    monkeypatch.setattr(build_kernels, "compile_all", stop)


def _deny_writes(monkeypatch, denied) -> None:
    """os.open as another account's files and folders meet it: PermissionError where ``denied(path, flags)``."""
    import errno
    import os

    real_open = os.open

    def open_as_another_account(path, flags, *args):
        if denied(path, flags):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_as_another_account)


def _refused_before_compiling(monkeypatch, argv) -> None:
    """build_kernels.main(argv) stops with the parser's status 2 before it asks for any compile."""
    import build_kernels

    asked = []
    _stop_at_compile(monkeypatch, asked)
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(argv)
    assert stop.value.code == 2 and asked == []


def test_a_build_without_only_takes_every_family_of_every_arch(tmp_path, monkeypatch):
    """Without --only the contract's families are built for each arch that has them: the refusal of an --only family
    with no variant for an arch (sparse_mla_decode has none for sm_100a) does not apply to a whole build."""
    import build_kernels

    asked = []
    _stop_at_compile(monkeypatch, asked)
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--out", str(tmp_path)])
    assert stop.value.code == 0
    assert asked == [{arch: [v.name for v in all_variants(arch)] for arch in ("sm_90a", "sm_100a")}]


def test_check_with_only_compares_only_those_families(tmp_path, monkeypatch, capsys):
    """--check --only probe rebuilds the probes and compares them alone: the committed entries of the other families
    are not "in the committed manifest but not built"; a check without differences passes with exit 0."""
    import build_kernels
    from runtime.contract import FAMILIES

    calls = []
    monkeypatch.setattr(build_kernels, "compile_all", lambda variants_by_arch, jobs: {})
    monkeypatch.setattr(build_kernels, "write_cache", lambda out, vba, cubins, families, **kw: calls.append(families))
    monkeypatch.setattr(build_kernels, "check_against", lambda *args: calls.append(args[2:]) or [])
    assert build_kernels.main(["--check", "--only", "probe", "--arch", "sm_90a"]) == 0
    assert calls == [tuple(FAMILIES), (["sm_90a"], ("probe",))]
    assert capsys.readouterr().out.rstrip().endswith("check passed")


def test_the_source_hash_is_taken_before_compiling(tmp_path, monkeypatch):
    """main hands write_cache the source hash from before the minutes of compiling, so that an edit during them
    stops the build (write_cache compares it with the sources then)."""
    import build_kernels

    hashes = iter(["before", "after"])
    written = []
    monkeypatch.setattr(build_kernels, "source_hash", lambda: next(hashes))
    monkeypatch.setattr(build_kernels, "_warn_of_build_switches", lambda: None)
    monkeypatch.setattr(build_kernels, "compile_all", lambda variants_by_arch, jobs: build_kernels.source_hash())
    monkeypatch.setattr(build_kernels, "write_cache",
                        lambda out, vba, cubins, families, sources: written.append((cubins, sources)))
    assert build_kernels.main(["--only", "probe", "--arch", "sm_90a", "--out", str(tmp_path)]) == 0
    assert written == [("after", "before")]


def test_deepgemm_cache_dir_alone_is_refused(tmp_path, capsys):
    """--deepgemm-cache-dir, like the shape options, belongs to --warm-deepgemm: without it the build would ignore
    it and compile cubins."""
    import build_kernels

    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--deepgemm-cache-dir", str(tmp_path), "--out", str(tmp_path)])
    assert stop.value.code == 2 and "go with --warm-deepgemm" in capsys.readouterr().err


def test_warm_deepgemm_sets_the_jit_cache_dir_before_deepgemm_loads(tmp_path, monkeypatch):
    """--deepgemm-cache-dir becomes DG_JIT_CACHE_DIR before DeepGEMM is imported (deepgemm_status imports it), which
    reads it only then."""
    import os

    import build_kernels
    from runtime import scoring

    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    seen = []

    def status():
        seen.append(os.environ.get("DG_JIT_CACHE_DIR"))
        return False, "no CUDA device"

    monkeypatch.setattr(scoring, "deepgemm_status", status)
    assert build_kernels.main(["--warm-deepgemm", "--deepgemm-cache-dir", str(tmp_path)]) == 1
    assert seen == [str(tmp_path)]


def test_a_kernel_whose_parameters_differ_from_the_contract_is_refused():
    """The manifest's parameter list pairs the contract's parameters with the cubin's (zip): a kernel of one more
    parameter than the contract lists would have been written with the contract's alone. The sizes are compared
    first, and a difference stops the build naming both."""
    import dataclasses

    import build_kernels
    from runtime.contract import Param

    variant, cubin = _a_probe_cubin()
    longer = dataclasses.replace(variant, params=(*variant.params, Param("extra", "int32_t")))
    with pytest.raises(SystemExit, match=rf"{variant.name} \(sm_90a\): kernel parameter sizes \[.*\] do not match the "
                                         r"contract .*\('extra', 'int32_t'\)"):
        build_kernels.manifest_entry(longer, "sm_90a", cubin)


def test_cubin_of_refuses_a_compile_that_kept_no_cubin(monkeypatch):
    """CuTe DSL fills __cubin__ only when asked to keep it: a compile that kept none (None) or an empty one is a
    RuntimeError naming the function and arch, not a manifest entry of zero bytes."""
    import types

    from kernels import compile as kc

    def launch():
        pass

    for kept in (None, b""):
        monkeypatch.setattr(kc, "cute", types.SimpleNamespace(compile=lambda fn, *a, options, kept=kept:
                                                               types.SimpleNamespace(__cubin__=kept)))
        with pytest.raises(RuntimeError, match="CuTe DSL produced no cubin for launch on sm_90a"):
            kc.cubin_of(launch, arch="sm_90a")


def test_a_switch_set_to_nothing_is_not_recorded(monkeypatch):
    """A variable set empty (``SPARSE_MLA_EXPERIMENT=``) selects nothing in the kernels, which read it with
    os.environ.get: it is not a measurement build."""
    from kernels import compile as kc

    monkeypatch.setenv(kc.SPARSE_MLA_SWITCH, "")
    monkeypatch.setenv("CUTE_DSL_LINEINFO", "")
    monkeypatch.setenv(kc.DECODE_TOPK_SWITCH, "timeline")
    assert kc.build_switches() == {kc.DECODE_TOPK_SWITCH: "timeline"}


def test_every_cute_dsl_variable_counts_where_its_declarations_cannot_be_read(monkeypatch):
    """Another CuTe DSL release whose settings cannot be read: every CUTE_DSL_* variable set is taken as changing
    the cubins (recorded, the cache refused), rather than none."""
    import sys

    import cutlass.base_dsl

    from kernels import compile as kc

    monkeypatch.delattr(cutlass.base_dsl, "env_manager", raising=False)
    monkeypatch.setitem(sys.modules, "cutlass.base_dsl.env_manager", None)
    monkeypatch.setenv("CUTE_DSL_SOMETHING_NEW", "1")
    assert "CUTE_DSL_SOMETHING_NEW" in kc._compile_affecting_dsl_variables()
    assert kc.build_switches()["CUTE_DSL_SOMETHING_NEW"] == "1"


def test_manifest_entry_rebuilds_every_committed_entry_from_its_cubin():
    """Every field manifest_entry writes (config, cluster, non_portable_cluster, params, contract hash, ...) as the
    committed manifests hold it, for every family: the probes the other build tests compile have no config beyond
    their cluster and no cluster above 8, so a field written wrong for the other variants went unseen on CPU."""
    import build_kernels

    for arch in ("sm_90a", "sm_100a"):
        committed = {e["name"]: e for e in json.loads(manifest_path(REPO, arch).read_text())["kernels"]}
        variants = all_variants(arch)
        assert any(v.non_portable_cluster for v in variants), "no variant of a cluster above 8 left to check"
        for v in variants:
            assert build_kernels.manifest_entry(v, arch, (REPO / committed[v.name]["cubin"]).read_bytes()) == \
                committed[v.name], v.name


def test_a_build_lock_it_can_only_read_is_refused_before_compiling(tmp_path, monkeypatch):
    """_require_writable opens the build lock for writing, as FileLock will: a lock file another account created
    that this one may read but not write passed a check that opened it for reading, and the build failed after its
    minutes of compiling. (Simulated: this suite may run as root, which any file's mode lets write.)"""
    import os

    lock = tmp_path / ".build.lock"
    lock.write_text("")
    _deny_writes(monkeypatch, lambda path, flags: Path(path) == lock and flags & (os.O_WRONLY | os.O_RDWR))
    _refused_before_compiling(monkeypatch, ["--only", "probe", "--out", str(tmp_path)])


@pytest.mark.parametrize("target", ["a file", "nothing"])
def test_a_symlinked_build_lock_is_refused_before_compiling(tmp_path, monkeypatch, capsys, target):
    """_require_writable opened the build lock through a symlink, which FileLock (O_NOFOLLOW) then refused after every
    compile with a bare ELOOP traceback; a load opens it so too and reads unguarded. A link to nothing had its target
    created outside the cache by the check. Now refused before compiling, naming the link and the fix."""
    import os

    import build_kernels

    elsewhere = tmp_path / "elsewhere.lock"
    if target == "a file":
        elsewhere.write_text("")
    out = tmp_path / "cache"
    out.mkdir()
    os.symlink(elsewhere, out / ".build.lock")
    asked = []
    _stop_at_compile(monkeypatch, asked)
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--only", "probe", "--out", str(out)])
    assert stop.value.code == 2 and asked == []
    err = capsys.readouterr().err
    assert f"cannot open its build lock {out / '.build.lock'} for writing (a symlink to {elsewhere}" in err, err
    assert "; remove the link (a load creates it again)" in err
    assert elsewhere.exists() == (target == "a file")


def test_check_waits_for_a_build_writing_the_committed_cache(tmp_path, monkeypatch):
    """--check read the committed manifest and cubins without the build lock: a build of that cache between its
    cubins and its manifest made it report the new cubins as not matching the old manifest, as a load would."""
    import shutil
    import threading

    from crafted_cache import copy_probe_cache
    from filelock import FileLock

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    committed, fresh = copy_probe_cache(tmp_path / "committed"), copy_probe_cache(tmp_path / "fresh")
    variants = all_variants("sm_90a", ("probe",))
    cubins = {(v.name, "sm_90a"): (fresh / "cubins" / "sm_90a" / f"{v.name}.cubin").read_bytes() + b"\0" * 16
              for v in variants}
    build_kernels.write_cache(fresh, {"sm_90a": variants}, cubins, ("probe",))  # what the build writes
    halfway, done = threading.Event(), threading.Event()

    def build_of_the_committed_cache():
        with FileLock(str(committed / ".build.lock")):
            shutil.copytree(fresh / "cubins", committed / "cubins", dirs_exist_ok=True)
            halfway.set()
            time.sleep(0.5)
            shutil.copy(manifest_path(fresh, "sm_90a"), manifest_path(committed, "sm_90a"))
        done.set()

    builder = threading.Thread(target=build_of_the_committed_cache)
    builder.start()
    assert halfway.wait(10)
    try:
        problems = build_kernels.check_against(committed, fresh, ["sm_90a"], ("probe",))
        assert done.is_set() and problems == [], problems
    finally:
        builder.join()


def test_a_build_on_a_filesystem_without_flock_does_not_wait_for_the_loads_lock_file(tmp_path, monkeypatch):
    """Without flock (ENOSYS: a Lustre mount without it, say) filelock falls back to a marker file at the lock's
    own path, and took the empty .build.lock that every load (and _require_writable) creates for a marker of an
    owner it cannot probe: the build waited forever after its compiles."""
    import errno
    import fcntl
    import threading

    from crafted_cache import copy_probe_cache

    import build_kernels
    from runtime.manifest import build_settled

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    with build_settled(cache):  # a load: it creates the lock file, and reads unguarded
        pass
    assert (cache / ".build.lock").exists()
    variants = all_variants("sm_90a", ("probe",))
    cubins = {(v.name, "sm_90a"): (cache / "cubins" / "sm_90a" / f"{v.name}.cubin").read_bytes() + b"\0" * 16
              for v in variants}
    builder = threading.Thread(target=build_kernels.write_cache, args=(cache, {"sm_90a": variants}, cubins,
                                                                       ("probe",)), daemon=True)
    builder.start()
    builder.join(10)
    assert not builder.is_alive(), "the build waits for a lock no one holds"
    check_cache(cache, "sm_90a")
    assert {v.name: (cache / "cubins" / "sm_90a" / f"{v.name}.cubin").read_bytes() for v in variants} == \
        {v.name: cubins[(v.name, "sm_90a")] for v in variants}
    assert not (cache / ".build.lock.soft").exists()  # the marker goes with the build


# --- build robustness review: interrupts, folders, --check's fix -----------------------------------------------------

@pytest.mark.parametrize("signum, raised", [("SIGINT", KeyboardInterrupt), ("SIGTERM", SystemExit)])
def test_an_interrupt_between_the_renames_lands_the_manifest_with_its_cubins(tmp_path, monkeypatch, signum, raised):
    """A Ctrl-C (or a SIGTERM, which the build turns into SystemExit) between an arch's cubins' renames and its
    manifest's left the new cubins under the old manifest: every load refused the arch until a rebuild. The signal
    is now delivered after the manifest's rename: the build stops there with a consistent cache."""
    import os
    import signal

    from crafted_cache import copy_probe_cache

    import build_kernels

    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: {"python": "3"})  # no CuTe DSL compile for it
    cache = copy_probe_cache(tmp_path)
    variants = all_variants("sm_90a", ("probe",))
    folder = cache / "cubins" / "sm_90a"
    cubins = {(v.name, "sm_90a"): (folder / f"{v.name}.cubin").read_bytes() + b"\0" * 16 for v in variants}
    real_sync, sent = build_kernels._fsync_directory, []

    def sync(directory):  # the signal arrives once the cubins are renamed, before the manifest is
        if not sent:
            sent.append(directory)
            os.kill(os.getpid(), getattr(signal, signum))
        real_sync(directory)

    monkeypatch.setattr(build_kernels, "_fsync_directory", sync)
    with pytest.raises(raised), build_kernels._sigterm_as_exit():
        build_kernels.write_cache(cache, {"sm_90a": variants}, cubins, ("probe",))
    assert sent == [folder]
    check_cache(cache, "sm_90a")  # the new manifest names the new cubins
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {f"{v.name}.cubin": cubins[(v.name, "sm_90a")]
                                                                  for v in variants}


def _main_in_a_subprocess(tmp_path: Path, patch: str, *args: str) -> subprocess.CompletedProcess:
    """build_kernels.main(args) in its own process (a signal's default action would end pytest's), after ``patch``
    (Python run first, with build_kernels, os, signal and Path imported); its temporary folders under tmp_path/tmp."""
    import os

    (tmp_path / "tmp").mkdir()
    script = ("import os, signal, sys\nfrom pathlib import Path\nimport build_kernels\n" + patch
              + "\nsys.exit(build_kernels.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)})


def test_sigterm_during_a_check_removes_its_temporary_build(tmp_path):
    """A SIGTERM (a CI job's timeout) while --check compiled in its own process (--jobs 1) or wrote its fresh build
    ended it by the signal's default action: the aot_check_* folder stayed in the temporary directory, a fresh cubin
    cache and all, each time. It is now a SystemExit(143), and the folder goes."""
    from crafted_cache import copy_probe_cache

    cache = copy_probe_cache(tmp_path / "cache")
    patch = ("def compile_all(variants_by_arch, jobs):\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "    signal.sigtimedwait([], 5)  # the handler runs here\n"
             "build_kernels.compile_all = compile_all")
    proc = _main_in_a_subprocess(tmp_path, patch, "--check", "--only", "probe", "--arch", "sm_90a", "--out",
                                 str(cache))
    assert proc.returncode == 128 + 15, proc.stdout + proc.stderr
    assert [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("aot_check_")] == []


def test_ctrl_c_ends_the_command_line_with_one_line_and_status_130(tmp_path):
    """A Ctrl-C during the compiles printed a KeyboardInterrupt traceback (and, with --jobs, one from each pool
    worker). The command line now prints one line saying the cache is consistent and exits 130, as shells report
    SIGINT; the check's temporary build is removed on the way out, as under SIGTERM."""
    import os

    from crafted_cache import copy_probe_cache

    cache = copy_probe_cache(tmp_path / "cache")
    (tmp_path / "tmp").mkdir()
    script = ("import os, signal, sys\nimport build_kernels\n"
              "def compile_all(variants_by_arch, jobs):\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    signal.sigtimedwait([], 5)  # the handler runs here\n"
              "build_kernels.compile_all = compile_all\n"
              "sys.exit(build_kernels._command_line(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "--check", "--only", "probe", "--arch", "sm_90a", "--out",
                           str(cache)], capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "interrupted" in proc.stderr and "run the build again" in proc.stderr
    assert [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("aot_check_")] == []


def test_compile_workers_leave_ctrl_c_to_the_build():
    """A terminal's Ctrl-C reaches every process of the group: each spawn worker printed its own traceback. The pool's
    initializer makes a worker ignore SIGINT (the build terminates its pool on the way out)."""
    import multiprocessing
    import os
    import signal

    import build_kernels

    with multiprocessing.get_context("spawn").Pool(1, build_kernels._worker_ignores_ctrl_c) as pool:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
        pid = pool.apply(os.getpid)
        os.kill(pid, signal.SIGINT)
        assert pool.apply(os.getpid) == pid  # the same worker answers: it outlived the signal


def test_sigterm_during_a_write_removes_its_staged_copies(tmp_path):
    """A SIGTERM while write_cache staged an arch's files ended the build by the signal's default action, and its
    staged copies (cubins/<arch>/.<name>.cubin.*) stayed in the cache until the next build, named by no manifest
    entry: shipped by a plain install, a failure of --check. It is now a SystemExit(143) that removes them."""
    from crafted_cache import copy_probe_cache

    cache = copy_probe_cache(tmp_path / "cache")
    before = {p.relative_to(cache): p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    patch = ("build_kernels.toolchain_info = lambda: {'python': '3'}  # no CuTe DSL compile for it\n"
             "folder = Path(sys.argv[-1]) / 'cubins'\n"
             "build_kernels.compile_all = lambda variants_by_arch, jobs: {\n"
             "    (v.name, arch): (folder / arch / f'{v.name}.cubin').read_bytes() + bytes(16)\n"
             "    for arch, variants in variants_by_arch.items() for v in variants}\n"
             "real_fsync = os.fsync\n"
             "def fsync(fd):  # the first staged cubin is on disk: the signal comes\n"
             "    real_fsync(fd)\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "    signal.sigtimedwait([], 5)  # the handler runs here\n"
             "os.fsync = fsync")
    proc = _main_in_a_subprocess(tmp_path, patch, "--only", "probe", "--arch", "sm_90a", "--out", str(cache))
    assert proc.returncode == 128 + 15, proc.stdout + proc.stderr
    after = {p.relative_to(cache): p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    assert after == {**before, Path(".build.lock"): b""}  # nothing replaced, nothing staged left
    check_cache(cache, "sm_90a")


@pytest.mark.parametrize("folder", ["cubins/sm_90a", "manifests", "cubins"])
def test_a_cache_folder_it_cannot_write_is_refused_before_compiling(tmp_path, monkeypatch, capsys, folder):
    """A cache root this account can write, holding cubins/<arch>/ or manifests/ it cannot (a cache another account
    built), passed _require_writable's check of the root, and the build failed after its compiles with a bare
    PermissionError at the first staged file. (Simulated: this suite may run as root, which any mode lets write.)"""
    import os

    from crafted_cache import copy_probe_cache

    cache = copy_probe_cache(tmp_path, archs=("sm_90a",) if folder != "cubins" else ())
    locked = cache / folder
    locked.mkdir(parents=True, exist_ok=True)
    # no file made in ``locked`` (O_TMPFILE opens the folder itself)
    _deny_writes(monkeypatch, lambda path, flags: locked in (Path(path), Path(path).parent)
                 and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    _refused_before_compiling(monkeypatch, ["--only", "probe", "--arch", "sm_90a", "--out", str(cache)])
    written = "manifests" if folder == "manifests" else "cubins/sm_90a"
    assert (f"--out {cache}: cannot write in {locked} (Permission denied), where the build writes {written}/; let "
            f"this account write it, or build with another --out") in capsys.readouterr().err


@pytest.mark.parametrize("refused, fix", [
    ("empty_cluster1", "--only cannot mend a manifest's source stamp, toolchain or form, or an entry it keeps; run: "
                       "python build_kernels.py --arch sm_90a --out {out}"),
    ("probe_cluster2", "run: python build_kernels.py --arch sm_90a --out {out} --only probe"),
], ids=["an entry of another family", "an entry of the family checked"])
def test_check_with_only_names_a_build_that_mends_a_runtime_refusal(tmp_path, monkeypatch, capsys, refused, fix):
    """A committed cache that the runtime refuses for an entry of a family --check --only did not check (here one
    whose shared memory the contract no longer gives) was told 'run: ... --only probe', a build that refuses to keep
    that entry ('build every family (no --only)'). Only a refusal of an entry the check rebuilt (here a cubin linked
    from outside the root) keeps --only in the fix."""
    import shutil

    committed, fresh, data, empty = _probe_caches_and_an_empty_entry(tmp_path)
    data["kernels"].append({**empty, "smem_bytes": empty["smem_bytes"] + 16} if refused == "empty_cluster1" else empty)
    manifest_path(committed, "sm_90a").write_text(json.dumps(data))
    if refused == "probe_cluster2":
        outside = tmp_path / "outside.cubin"
        shutil.copy(committed / "cubins/sm_90a/probe_cluster2.cubin", outside)
        (committed / "cubins/sm_90a/probe_cluster2.cubin").unlink()
        (committed / "cubins/sm_90a/probe_cluster2.cubin").symlink_to(outside)
    out = _check_only_probe_refused(monkeypatch, capsys, committed, fresh)
    assert f"kernel {refused}:" in out[0]
    assert out[-1] == f"check failed: 1 difference(s); {fix.format(out=committed)}"


def _probe_caches_and_an_empty_entry(tmp_path) -> tuple:
    """Two crafted sm_90a probe caches, (committed, fresh), the committed one's manifest as JSON, and the committed
    repository's empty_cluster1 entry, its cubin copied into the committed cache (an entry of another family, for
    the manifest to add)."""
    import shutil

    from crafted_cache import copy_probe_cache

    committed = copy_probe_cache(tmp_path / "committed", archs=("sm_90a",))
    fresh = copy_probe_cache(tmp_path / "fresh", archs=("sm_90a",))
    data = json.loads(manifest_path(committed, "sm_90a").read_text())
    empty = next(k for k in json.loads(manifest_path(REPO, "sm_90a").read_text())["kernels"]
                 if k["name"] == "empty_cluster1")
    shutil.copy(REPO / empty["cubin"], committed / empty["cubin"])
    return committed, fresh, data, empty


def _check_only_probe_refused(monkeypatch, capsys, committed, fresh) -> list:
    """``--check --only probe --arch sm_90a`` of ``committed`` against ``fresh`` (a crafted cache standing in for the
    fresh build, no CuTe DSL compile), asserted to fail on the runtime's refusal first; its output lines."""
    import shutil

    import build_kernels

    monkeypatch.setattr(build_kernels, "compile_all", lambda variants_by_arch, jobs: {})
    monkeypatch.setattr(build_kernels, "write_cache",
                        lambda out, *args, **kwargs: shutil.copytree(fresh, out, dirs_exist_ok=True))
    assert build_kernels.main(["--check", "--only", "probe", "--arch", "sm_90a", "--out", str(committed)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CHECK FAILED: sm_90a: the runtime refuses the committed manifest (")
    return out


@pytest.mark.parametrize("edit", [lambda e: e.update(size=float(e["size"])), None],
                         ids=["a float size", "a name given twice"])
def test_check_with_only_names_a_whole_build_where_an_entry_it_checked_fails_the_manifests_reading(
        tmp_path, monkeypatch, capsys, edit):
    """A checked family's entry that the runtime refuses while reading the manifest (5816.0 for 5816, which the
    check's == takes; the entry given twice, which its by-name dict keeps once) kept --only in the fix, and that
    build refuses: it reads the whole manifest before it keeps the other families' entries. Only a build of every
    family (which reads no previous manifest) mends it."""
    import build_kernels

    committed, fresh, data, empty = _probe_caches_and_an_empty_entry(tmp_path)
    data["kernels"].append(empty)  # an entry of another family, which --only probe keeps
    if edit is None:
        data["kernels"].append(dict(data["kernels"][0]))
    else:
        edit(data["kernels"][0])
    manifest_path(committed, "sm_90a").write_text(json.dumps(data))
    out = _check_only_probe_refused(monkeypatch, capsys, committed, fresh)
    assert f"kernel {data['kernels'][0]['name']}:" in out[0]
    assert out[-1] == ("check failed: 1 difference(s); --only cannot mend a manifest's source stamp, toolchain or "
                       f"form, or an entry it keeps; run: python build_kernels.py --arch sm_90a --out {committed}")
    monkeypatch.undo()
    monkeypatch.setattr(build_kernels, "toolchain_info", lambda: data["toolchain"])  # no CuTe DSL compile for it
    variants = all_variants("sm_90a", ("probe",))
    cubins = {(v.name, "sm_90a"): (fresh / "cubins" / "sm_90a" / f"{v.name}.cubin").read_bytes() for v in variants}
    with pytest.raises(SystemExit, match="--only keeps the other families' entries from this manifest, but"):
        build_kernels.write_cache(committed, {"sm_90a": variants}, cubins, ("probe",))  # the fix it gave before


@pytest.mark.parametrize("where", ["a folder that does not exist", "a folder without manifests"])
def test_check_of_an_out_without_a_manifest_is_refused_before_compiling(tmp_path, monkeypatch, capsys, where):
    """--check --out of a folder holding no manifest of the archs checked (a mistyped path) compiled every variant
    asked, minutes for a whole check, and then reported each manifest unreadable: refused first, with the fix."""
    import build_kernels

    out = tmp_path / "nothing"
    if where == "a folder without manifests":
        (out / "cubins").mkdir(parents=True)
    monkeypatch.setattr(build_kernels, "compile_all", lambda *args: pytest.fail("compiled for a check of no cache"))
    with pytest.raises(SystemExit) as stop:
        build_kernels.main(["--check", "--only", "probe", "--out", str(out)])
    assert stop.value.code == 2
    assert (f"--check --out {out}: no manifest of sm_90a sm_100a to check in {out / 'manifests'}; name the root of "
            f"a built cache, or build one: python build_kernels.py --arch sm_90a sm_100a --out {out}"
            in capsys.readouterr().err)

