"""The loader's CPU-side validation on crafted caches: every refusal is a typed CacheError."""

import hashlib
import re
import shutil
from pathlib import Path

import pytest
from crafted_cache import (
    REPO,
    add_param,
    contract_follows_the_manifest,
    copy_probe_cache,
    drop_last_param,
    edit_manifest,
    first_cubin,
    rewrite_first_cubin,
    sass_list_renamed,
    shift_second_param,
)

from runtime import errors
from runtime.contract import FAMILIES, family_contract_hash
from runtime.manifest import check_cache, manifest_path


@pytest.fixture
def cache(tmp_path):
    """A copy of the committed probe kernels of both archs under a temporary root."""
    return copy_probe_cache(tmp_path)


def test_committed_cache_passes_every_cpu_check():
    for arch in ("sm_90a", "sm_100a"):
        manifest = check_cache(REPO, arch)
        assert manifest.kernels, arch
        assert {"probe_cluster2", "probe_cluster8"} <= set(manifest.kernels)


def test_crafted_copy_passes(cache):
    assert set(check_cache(cache, "sm_90a").kernels) == {"probe_cluster2", "probe_cluster8"}


def test_a_subset_of_the_contract_passes(cache):
    """A manifest may hold some of the contract's kernels (a probe-only cache, a partial build)."""
    edit_manifest(cache, "sm_90a", lambda d: d.update(kernels=d["kernels"][1:]))
    assert set(check_cache(cache, "sm_90a").kernels) == {"probe_cluster8"}


def _rename_params(kernel):
    for p in kernel["params"]:
        p["name"] = "renamed"


@pytest.mark.parametrize("edit, fields", [
    (lambda k: k.update(cluster=[4, 1, 1]), "cluster"),
    (lambda k: k.update(cluster=[16, 1, 1], non_portable_cluster=True), "cluster, non_portable_cluster"),
    (_rename_params, "params"),
    (lambda k: k["params"][1].update(ctype="uint32_t"), "params"),
    (lambda k: k.update(threads=256), "threads"),
    (lambda k: k.update(smem_bytes=256), "smem_bytes"),
    (lambda k: k.update(pdl=False), "pdl"),
    (lambda k: k.update(family="empty"), "family"),
    (lambda k: k.update(config={"cluster": 2.0}), "config"),  # equal in Python, not the contract's int
    (lambda k: k.update(config={"cluster": 2, "extra": 1}), "config"),
    (lambda k: k.update(threads=256, pdl=False), "threads, pdl"),
])
def test_entry_contradicting_the_contract(cache, edit, fields):
    """The ops pack arguments and compute grids from the contract, the loader configures launches from the
    manifest: an entry differing from the contract's variant of its name is refused, naming each field."""
    edit_manifest(cache, "sm_90a", lambda d: edit(d["kernels"][0]))
    with pytest.raises(errors.ContractMismatchError, match=f"kernel probe_cluster2: the entry differs from this "
                                                           f"runtime's contract in {fields} \\(.*Fix: .*build_kernels"
                                                           f".py --arch sm_90a"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("arch, name", [("sm_90a", "probe_cluster4"), ("sm_100a", "sparse_mla_decode_w128_sinks")])
def test_entry_the_contract_does_not_know(cache, arch, name):
    """A kernel name the contract lacks for the manifest's arch (sparse MLA is sm_90a only) is refused."""
    edit_manifest(cache, arch, lambda d: d["kernels"][0].update(name=name))
    with pytest.raises(errors.ContractMismatchError, match=f"kernel {name}: this runtime's contract has no kernel "
                                                           f"of this name for {arch}"):
        check_cache(cache, arch)


@pytest.mark.parametrize("stamp", ["0" * 64, "f" * 64])
def test_entry_compiled_against_other_contract_sources_is_refused(cache, stamp):
    """Every field may agree while a constant the kernel compiles in (sparse MLA's finite -inf, a row bound of the
    top-k) differs from the host op's: an entry stamped with other contract sources than this runtime's is
    refused, naming both hashes and the rebuild."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(contract_hash=stamp))
    with pytest.raises(errors.ContractMismatchError, match=f"kernel probe_cluster2: the kernel was compiled against "
                                                           f"other contract sources .*probe.py: sha256 '{stamp[:12]}', "
                                                           f"this runtime's '{family_contract_hash('probe')[:12]}'"
                                                           f".*Fix: .*build_kernels.py --arch sm_90a"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("field", ["sha256", "contract_hash"])
@pytest.mark.parametrize("edit", [str.upper, lambda h: "", lambda h: h[:63], lambda h: h + "0", lambda h: " " + h[1:]])
def test_entry_digest_not_written_as_hashlib_writes_it_is_a_schema_error(cache, field, edit):
    """Only a string was asked of the digests: an uppercase or empty sha256 read as the cubin 'altered', an empty
    contract_hash as other contract sources, where the manifest field is what is malformed."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update({field: edit(d["kernels"][0][field])}))
    with pytest.raises(errors.SchemaError, match=f"probe_cluster2: manifest entry fields {field} have the wrong type "
                                                 f"or value"):
        check_cache(cache, "sm_90a")


def test_entry_without_a_contract_stamp_is_refused(cache):
    """A manifest written before entries were stamped: refused as one of an older build."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].pop("contract_hash"))
    with pytest.raises(errors.SchemaError, match="probe_cluster2: manifest entry lacks contract_hash"):
        check_cache(cache, "sm_90a")


def test_a_runtime_without_its_contract_sources_refuses_the_cache(cache, monkeypatch):
    """Shipped as .pyc only, the runtime cannot hash its contract: a ContractMismatchError (a refusal, so the ops fall
    back and say why), not an OSError escaping every op call."""
    import runtime.manifest as manifest_module

    def unreadable(family):
        raise FileNotFoundError(f"no such file: runtime/contract/{family}.py")

    monkeypatch.setattr(manifest_module, "family_contract_hash", unreadable)
    with pytest.raises(errors.ContractMismatchError, match="contract sources cannot be read.*probe.py.*Fix: install "
                                                           "the runtime with its sources"):
        check_cache(cache, "sm_90a")


def test_the_contract_stamp_covers_the_shared_module_and_the_familys_own():
    contract = REPO / "runtime" / "contract"
    for family in FAMILIES:
        h = hashlib.sha256()
        for path in (contract / "__init__.py", contract / f"{family}.py"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        assert family_contract_hash(family) == h.hexdigest(), family
    assert len({family_contract_hash(f) for f in FAMILIES}) == len(FAMILIES)
    with pytest.raises(ValueError, match="unknown kernel family 'nope'"):
        family_contract_hash("nope")


def test_missing_cubin(cache):
    first_cubin(cache).unlink()
    with pytest.raises(errors.MissingCubinError, match="probe_cluster2.*missing.*build_kernels.py"):
        check_cache(cache, "sm_90a")


def test_truncated_cubin(cache):
    f = first_cubin(cache)
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(errors.CubinIntegrityError, match="truncated"):
        check_cache(cache, "sm_90a")


def test_flipped_byte(cache):
    f = first_cubin(cache)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(errors.CubinIntegrityError, match="sha256"):
        check_cache(cache, "sm_90a")


def test_cubin_of_the_other_arch(cache):
    """An sm_100a cubin with a manifest entry (size, sha256) rewritten to match it."""
    import hashlib

    other = first_cubin(cache, "sm_100a").read_bytes()
    first_cubin(cache).write_bytes(other)

    def swap(data):
        k = data["kernels"][0]
        k["size"], k["sha256"] = len(other), hashlib.sha256(other).hexdigest()

    edit_manifest(cache, "sm_90a", swap)
    with pytest.raises(errors.CubinArchError, match="sm_100.*sm_90a"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("path, error, match", [
    *[(p, errors.PathError, "leaves the cache root") for p in ("../outside.cubin", "cubins/../../outside.cubin",
                                                              "/etc/passwd", "..\\outside/probe_cluster2.cubin")],
    # Inside the root but not a readable file: a typed error, not OSError / ValueError.
    *[(p, errors.CubinIntegrityError, "not a readable file") for p in ("cubins/sm_90a/probe_cluster2.cubin/",
                                                                      "cubins/a\0b/probe_cluster2.cubin")],
    # Named for another file than the kernel's own, refused before anything is read.
    *[(p, errors.PathError, r"not the kernel's own file \(probe_cluster2\.cubin\)")
      for p in ("cubins/sm_90a", "cubins/sm_90a/probe_cluster8.cubin", "cubins/sm_90a/probe_cluster2.cubin.bak")],
])
def test_cubin_path_refused(cache, path, error, match):
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(cubin=path))
    with pytest.raises(error, match=match):
        check_cache(cache, "sm_90a")


def test_cubin_path_is_a_directory(cache):
    """A directory inside the root named for the kernel's cubin: a typed error, not IsADirectoryError."""
    (cache / "cubins" / "elsewhere" / "probe_cluster2.cubin").mkdir(parents=True)
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(cubin="cubins/elsewhere/probe_cluster2.cubin"))
    with pytest.raises(errors.CubinIntegrityError, match="not a readable file"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "/dev/null"])
def test_cubin_symlink_to_a_special_file(cache, target):
    """A cubin path inside the root whose symlink names a FIFO or a device (the lexical root check does not
    follow links): refused as not a regular file, without blocking on the FIFO or reading the device."""
    import os

    cubin = first_cubin(cache)
    if target == "fifo":
        target = str(cubin.parent / "writer_never_comes")
        os.mkfifo(target)
    cubin.unlink()
    cubin.symlink_to(target)
    if target.startswith("/dev/"):  # outside the root: refused by where it leads, before the device is opened
        with pytest.raises(errors.PathError, match="resolves to /dev/.*outside the cache root"):
            check_cache(cache, "sm_90a")
        return
    with pytest.raises(errors.CubinIntegrityError, match="not a readable file.*not a regular file"):
        check_cache(cache, "sm_90a")


@pytest.fixture(params=["proc", "no_proc"])
def real_path_by(request, monkeypatch):
    """Where the loader learns a file's real path: /proc/self/fd (Linux), or resolving the path where /proc is not."""
    import os

    if request.param == "no_proc":
        real_readlink = os.readlink

        def no_proc(path, *args, **kwargs):
            if str(path).startswith("/proc/self/fd/"):
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return real_readlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "readlink", no_proc)
    return request.param


def _link_out_of_the_root(cache, tmp_path, what):
    """Move the first cubin, the sm_90a cubins/ folder or the manifest out of the root, leaving a symlink in its
    place (the bytes, and so size and sha256, unchanged); returns the path inside the root that refusals name."""
    outside = tmp_path.parent / f"{tmp_path.name}_outside"
    outside.mkdir()
    inside = {"cubin": first_cubin(cache), "folder": first_cubin(cache).parent,
              "manifest": manifest_path(cache, "sm_90a")}[what]
    shutil.move(inside, outside / inside.name)
    inside.symlink_to(outside / inside.name)
    return first_cubin(cache) if what == "folder" else inside


@pytest.mark.parametrize("what", ["cubin", "folder", "manifest"])
def test_a_symlink_leading_out_of_the_cache_root_is_refused(cache, tmp_path, real_path_by, what):
    """The root is the trust boundary (its build lock covers only files inside it): a cubin, a cubins/ folder or a
    manifest that is a symlink to a file outside the root was followed, although the manifest's path check says
    "inside the root". Refused as a PathError naming the file inside the root and the fix."""
    named = _link_out_of_the_root(cache, tmp_path, what)
    with pytest.raises(errors.PathError, match="resolves to .*_outside/.*, outside the cache root .*Fix: put the file "
                                               "itself in the cache root") as e:
        check_cache(cache, "sm_90a")
    assert e.value.file == named
    assert e.value.kernel == (None if what == "manifest" else "probe_cluster2")


def test_symlinks_that_stay_inside_the_cache_root_pass(cache, tmp_path, real_path_by):
    """A link inside the root to a file inside it, and a root that is itself a symlink, are not refused."""
    arch_folder = first_cubin(cache).parent
    arch_folder.rename(arch_folder.with_name("sm_90a_real"))
    arch_folder.symlink_to("sm_90a_real")
    linked_root = tmp_path.parent / f"{tmp_path.name}_link"
    linked_root.symlink_to(cache)
    assert set(check_cache(linked_root, "sm_90a").kernels) == {"probe_cluster2", "probe_cluster8"}


@pytest.mark.parametrize("schema", [0, 2, "1", None, True, 1.0])  # true and 1.0 equal 1 in Python
def test_unknown_schema(cache, schema):
    edit_manifest(cache, "sm_90a", lambda d: d.update(schema=schema))
    with pytest.raises(errors.SchemaError, match="schema"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_manifest_symlink_to_a_special_file(cache, target):
    """A manifest that is a FIFO or a device: refused, without blocking on the FIFO or reading the device."""
    import os

    path = manifest_path(cache, "sm_90a")
    path.unlink()
    if target == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(target)
    if target.startswith("/dev/"):  # outside the root: refused by where it leads, before the device is opened
        with pytest.raises(errors.PathError, match="resolves to /dev/.*outside the cache root"):
            check_cache(cache, "sm_90a")
        return
    with pytest.raises(errors.SchemaError, match="not readable JSON.*not a regular file"):
        check_cache(cache, "sm_90a")


def test_oversized_manifest(cache, monkeypatch):
    from runtime import manifest

    monkeypatch.setattr(manifest, "MANIFEST_MAX_BYTES", 100)
    with pytest.raises(errors.SchemaError, match="over 100 bytes"):
        check_cache(cache, "sm_90a")


def test_not_json(cache):
    manifest_path(cache, "sm_90a").write_text("{not json")
    with pytest.raises(errors.SchemaError, match="JSON"):
        check_cache(cache, "sm_90a")


def test_entry_missing_fields(cache):
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].pop("sha256"))
    with pytest.raises(errors.SchemaError, match="lacks sha256"):
        check_cache(cache, "sm_90a")


def test_duplicate_kernel_name(cache):
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"].append(dict(d["kernels"][0])))
    with pytest.raises(errors.DuplicateKernelError, match="probe_cluster2"):
        check_cache(cache, "sm_90a")


def test_param_list_contradicting_the_elf(cache):
    edit_manifest(cache, "sm_90a", shift_second_param)
    with pytest.raises(errors.ParamLayoutError, match="contradict the cubin's ELF"):
        check_cache(cache, "sm_90a")


def test_param_size_contradicting_the_elf_in_its_high_bits(cache):
    """The size field of an EIATTR_KPARAM_INFO record is 14 bits (18..31): a second parameter of 1024 + 4 bytes is
    not the manifest's int32_t."""
    import struct

    def widen_second_param(data):
        at = bytes(data).index(bytes([4, 0x17, 12, 0, 0, 0, 0, 0, 1, 0]))  # ordinal 1's record
        bits, = struct.unpack_from("<I", data, at + 12)
        struct.pack_into("<I", data, at + 12, bits | 1024 << 18)

    rewrite_first_cubin(cache, "sm_90a", widen_second_param)
    with pytest.raises(errors.ParamLayoutError, match=r"\(8, 4\)\] contradict the cubin's ELF: .*\(8, 1028\)\]"):
        check_cache(cache, "sm_90a")


def test_extra_param_contradicting_the_elf(cache, monkeypatch):
    edit_manifest(cache, "sm_90a", add_param)
    contract_follows_the_manifest(monkeypatch, cache)  # the cubin, not the contract, disagrees
    with pytest.raises(errors.ParamLayoutError, match="contradict the cubin's ELF"):
        check_cache(cache, "sm_90a")


def test_missing_param_contradicting_the_elf(cache, monkeypatch):
    edit_manifest(cache, "sm_90a", drop_last_param)
    contract_follows_the_manifest(monkeypatch, cache)
    with pytest.raises(errors.ParamLayoutError, match="contradict the cubin's ELF"):
        check_cache(cache, "sm_90a")


def test_symbol_absent(cache):
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(symbol="kernel_that_is_not_there"))
    with pytest.raises(errors.SymbolError, match="kernel_that_is_not_there"):
        check_cache(cache, "sm_90a")


def test_manifest_for_another_arch(cache):
    shutil.copy(manifest_path(cache, "sm_100a"), manifest_path(cache, "sm_90a"))
    with pytest.raises(errors.SchemaError, match="sm_100a"):
        check_cache(cache, "sm_90a")


def test_errors_share_one_base_and_name_the_fix(cache):
    first_cubin(cache).unlink()
    with pytest.raises(errors.CacheError) as e:
        check_cache(cache, "sm_90a")
    assert e.value.kernel == "probe_cluster2" and "build_kernels.py --arch sm_90a" in str(e.value)


def test_no_driver_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import runtime

    with pytest.raises(errors.NoDriverError, match="Fix:"):
        runtime.load()


@pytest.mark.parametrize("field, value", [
    ("pdl", "false"), ("non_portable_cluster", True), ("size", 5816.5), ("threads", True), ("threads", -128),
    ("smem_bytes", -1), ("cluster", [0, 1, 1]), ("cluster", [2, 1]), ("config", [["cluster", 2]]),
    ("params", [{"name": "out", "ctype": ["void*"], "offset": 0, "size": 8}]),
    ("threads", 1025), ("threads", 0), ("size", 0),
    ("params", [{"name": "out", "ctype": "void*", "offset": 0, "size": 4}]),  # a pointer is 8 bytes
    ("params", [{"name": "out", "ctype": "void*", "offset": -8, "size": 8}]),
    # an unknown C type without a size: both sides of the size check were None, then p["size"] a bare KeyError
    ("params", [{"name": "out", "ctype": "int16_t", "offset": 0}]),
])
def test_entry_field_of_the_wrong_type_or_value(cache, field, value):
    """Manifest values become the launch configuration: no coercion ("false" -> True), no 0-CTA cluster."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update({field: value}))
    with pytest.raises(errors.SchemaError, match=f"probe_cluster2.*{field}"):
        check_cache(cache, "sm_90a")


def test_the_fix_rebuilds_the_refused_cache_not_the_checkouts(cache, monkeypatch):
    """build_kernels.py writes to this checkout unless --out says otherwise: the fix for a cache at
    $SPARSE_DECODE_AOT_CACHE names that root, or following it rebuilt the checkout and left the refused cache as it was."""
    from runtime.errors import rebuild
    from runtime.manifest import CACHE_ROOT_ENV

    cubin = first_cubin(cache)
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0x40
    cubin.write_bytes(bytes(data))
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))
    with pytest.raises(errors.CubinIntegrityError) as refused:
        check_cache(None, "sm_90a")
    assert refused.value.fix == f"python build_kernels.py --arch sm_90a --out {cache.resolve()}"
    assert rebuild("sm_90a", REPO) == "python build_kernels.py --arch sm_90a"  # the build's default root


def test_a_fix_naming_the_cache_root_is_a_command_a_shell_runs_as_written(tmp_path, monkeypatch):
    """The fixes name the root in a command to paste into a shell: a root with a space (or a ';') was written bare,
    so the rebuild split it in two (argparse: unrecognized arguments) and the chmod changed the wrong folders."""
    import errno
    import shlex

    from runtime import manifest

    cache = copy_probe_cache(tmp_path / "serving cache;x")
    cubin = first_cubin(cache)
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0x40
    cubin.write_bytes(bytes(data))
    with pytest.raises(errors.CubinIntegrityError) as refused:
        check_cache(cache, "sm_90a")
    assert shlex.split(refused.value.fix)[-2:] == ["--out", str(cache.resolve())]

    def unreadable(path, limit, inside=None):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(manifest, "_read_regular_file", unreadable)
    with pytest.raises(errors.SchemaError) as refused:
        check_cache(cache, "sm_90a")
    assert shlex.split(refused.value.fix.split(": ", 1)[1])[:4] == ["chmod", "-R", "a+rX", str(cache.resolve())]


@pytest.mark.parametrize("field, value", [("toolchain", "12.9"), ("toolchain", ["cutlass"]), ("source_hash", 5)])
def test_manifest_header_field_of_the_wrong_type(cache, field, value):
    """python -m runtime verify prints the toolchain and source hash: a wrong type is a SchemaError naming the field,
    not an AttributeError there."""
    edit_manifest(cache, "sm_90a", lambda d: d.update({field: value}))
    with pytest.raises(errors.SchemaError, match=f"fields {field} have the wrong type.*build_kernels.py"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("field", ["toolchain", "source_hash"])
def test_manifest_without_a_header_field_is_refused(cache, field):
    """A manifest without its toolchain or source hash defaulted to {} and "": accepted, the measurement-build check
    skipped without a word, and verify printing an empty source hash. Every build writes both."""
    edit_manifest(cache, "sm_90a", lambda d: d.pop(field))
    with pytest.raises(errors.SchemaError, match=f"manifest lacks {field}.*build_kernels.py"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("kernels", [None, 5, {}])
def test_manifest_without_a_list_of_kernels(cache, kernels):
    """Not an empty cache that silently sends every call to the fallbacks."""
    edit_manifest(cache, "sm_90a", lambda d: d.pop("kernels") if kernels is None else d.update(kernels=kernels))
    with pytest.raises(errors.SchemaError, match="list of kernels"):
        check_cache(cache, "sm_90a")


def _bad_section_name(data):
    import struct

    shoff, = struct.unpack_from("<Q", data, 0x28)
    data[shoff + 64 : shoff + 68] = struct.pack("<I", len(data))  # section 1's name past the end


def _tiny_section_headers(data):
    """e_shentsize 1 and the headers in the last e_shnum bytes: each 64-byte read runs past the end."""
    import struct

    shnum, = struct.unpack_from("<H", data, 0x3C)
    struct.pack_into("<Q", data, 0x28, len(data) - shnum)
    struct.pack_into("<H", data, 0x3A, 1)


def _header_cut_short(data):
    """60 bytes, no program headers: the section header fields (0x3A..0x40) lie past the end."""
    del data[60:]
    data[0x38:0x3A] = b"\0\0"


def _string_table_index_past_the_table(data):
    import struct

    struct.pack_into("<H", data, 0x3E, struct.unpack_from("<H", data, 0x3C)[0])  # e_shstrndx = e_shnum


def _wide_section_headers(data):
    """e_shentsize 128 (the table of e_shnum such headers would also run past the end)."""
    import struct

    struct.pack_into("<H", data, 0x3A, 128)


def _section_header(data, name: bytes) -> int:
    """The file offset of the section header named ``name`` (or the first whose name starts with it)."""
    import struct

    from runtime import cubin

    heads, shstrndx = cubin._section_heads(bytes(data))
    strtab = heads[shstrndx][4]
    index = next(i for i, h in enumerate(heads) if bytes(data[strtab + h[0]:]).startswith(name))
    return struct.unpack_from("<Q", data, 0x28)[0] + index * 64


def _section_past_the_end(data):
    """.debug_frame (104 bytes) starts at the file's end: its offset alone is past it."""
    import struct

    struct.pack_into("<Q", data, _section_header(data, b".debug_frame\0") + 24, len(data))


def _attribute_list_cut(into_record: int, record: bytes):
    """The kernel's attribute list ends ``into_record`` bytes into its record that starts with ``record``."""
    def edit(data):
        import struct

        at = _section_header(data, b".nv.info.kernel") + 24
        start, _size = struct.unpack_from("<QQ", data, at)
        struct.pack_into("<Q", data, at + 8, bytes(data).index(record, start) + into_record - start)
    return edit


def _unknown_attribute_format(data):
    """The kernel's last attribute record (after its parameters and block shape) of an unknown format, 9."""
    data[bytes(data).index(bytes([4, 0x36, 4, 0]))] = 9


def _short_block_shape(data):
    """The kernel's EIATTR_REQNTID record holds 4 bytes (then four empty records fill the 8 it no longer holds)."""
    at = bytes(data).index(_REQNTID_128)
    data[at + 2] = 4
    data[at + 8: at + 16] = bytes([1, 0]) * 4


def _short_param_record(data):
    """The second parameter's EIATTR_KPARAM_INFO record holds 8 bytes (then one empty 2-byte-value record fills the
    4 it no longer holds)."""
    at = bytes(data).index(bytes([4, 0x17, 12, 0, 0, 0, 0, 0, 1, 0]))  # ordinal 1's record
    data[at + 2] = 8
    data[at + 12: at + 16] = bytes([3, 0, 0, 0])


@pytest.mark.parametrize("craft, said", [
    (_short_param_record, "a kernel parameter's record is 8 bytes, not 12"),
    (_tiny_section_headers, "section header size 1 is not"),
    (_bad_section_name, "a section's name lies past the section names' string table"),
    (_header_cut_short, "not a little-endian ELF64"),
    (_string_table_index_past_the_table, "section headers run past"),
    (_wide_section_headers, "section header size 128 is not ELF64's 64"),
    (_section_past_the_end, "a section runs past"),
    (_attribute_list_cut(3, bytes([4, 0x36, 4, 0])), "attribute runs past its section"),  # in a record's header
    (_attribute_list_cut(2, bytes([3, 0x19])), "attribute runs past its section"),  # in a 2-byte value's record
    (_unknown_attribute_format, "unknown .nv.info attribute format 9"),
    (_short_block_shape, "required block shape is 4 bytes, not 12"),
])
def test_crafted_elf_is_a_typed_error(cache, craft, said):
    """A cubin with a matching sha256 but unreadable ELF is a CubinIntegrityError, not struct.error/ValueError."""
    rewrite_first_cubin(cache, "sm_90a", craft)
    with pytest.raises(errors.CubinIntegrityError, match=f"not a readable CUDA ELF \\(.*{re.escape(said)}"):
        check_cache(cache, "sm_90a")


@pytest.mark.parametrize("arch, flag_byte, flag", [("sm_100a", 0x30, 0x8), ("sm_90a", 0x31, 0x8)])
def test_cubin_without_the_a_flag(cache, arch, flag_byte, flag):
    """An sm_100 (not sm_100a) cubin: ABI v2 keeps the "a" in e_flags bit 3; an sm_90 one: ABI v1 in bit 11 (the
    committed sm_90a cubins also set bit 10, which is not the "a")."""
    rewrite_first_cubin(cache, arch, lambda d: d.__setitem__(flag_byte, d[flag_byte] & ~flag))
    with pytest.raises(errors.CubinArchError, match=f"targets {arch[:-1]}, the manifest says {arch}"):
        check_cache(cache, arch)


# --- thirty-eighth session's review: manifests and cubins that crashed untyped or passed ------------------------

def _write_manifest_text(root, text: bytes, arch="sm_90a"):
    manifest_path(root, arch).write_bytes(text)


def _manifest_bytes(root, arch="sm_90a") -> bytes:
    return manifest_path(root, arch).read_bytes()


@pytest.mark.parametrize("craft, match", [
    (lambda b: b"[" * 100000 + b"]" * 100000, "not readable JSON"),  # RecursionError inside json
    (lambda b: b"\xef\xbb\xbf" + b, "not readable JSON"),  # a UTF-8 byte-order mark
    (lambda b: b.decode().encode("utf-16"), "not readable JSON"),
    (lambda b: b.replace(b'"name": "probe_cluster2"', b'"name": "probe_cluster2", "name": "probe_cluster8"', 1),
     "appears twice"),
    (lambda b: b.replace(b'"symbol": "', b'"symbol": "\\ud800', 1), "lone surrogate"),
    (lambda b: b.replace(b'"name": "probe_cluster2"', b'"name": "probe\\udfff"', 1), "lone surrogate"),
])
def test_malformed_manifest_text_is_a_schema_error(cache, craft, match):
    """Nesting thousands deep, a byte-order mark or UTF-16, a key twice in one object and lone surrogates: each a
    SchemaError naming the manifest, not a RecursionError, a silently kept last key or a UnicodeEncodeError later."""
    text = _manifest_bytes(cache)
    assert b'"name": "probe_cluster2"' in text and b'"symbol": "' in text
    _write_manifest_text(cache, craft(text))
    with pytest.raises(errors.SchemaError, match=match) as e:
        check_cache(cache, "sm_90a")
    assert e.value.file == manifest_path(cache, "sm_90a")


def test_the_size_bounds_leave_the_committed_cache_room():
    """The bounds on a manifest's and a cubin's bytes keep a crafted file's checks short (a fuzz's 64 MiB cubin of 4M
    parameter records took 11 s to refuse): they sit at least eight times above the committed files."""
    from runtime.manifest import CUBIN_MAX_BYTES, MANIFEST_MAX_BYTES

    assert max(p.stat().st_size for p in (REPO / "manifests").glob("*.json")) * 8 <= MANIFEST_MAX_BYTES
    assert max(p.stat().st_size for p in (REPO / "cubins").rglob("*.cubin")) * 8 <= CUBIN_MAX_BYTES


@pytest.mark.parametrize("source_hash", ["x", "F" * 64, "f" * 63, "f" * 64 + "\0", "f" * 200_000])
def test_a_source_hash_that_no_build_writes_is_refused(cache, source_hash):
    """source_hash was any string (a NUL, 200 KB of text), printed by verify and the loader's messages; the build
    writes a SHA-256 hexdigest, as each entry's sha256 is."""
    edit_manifest(cache, "sm_90a", lambda d: d.update(source_hash=source_hash))
    with pytest.raises(errors.SchemaError, match=r"source_hash .*64 lowercase hex digits"):
        check_cache(cache, "sm_90a")


def test_a_parameter_list_past_any_kernels_is_not_quoted_whole():
    """A crafted attribute list of 262,144 parameter records (what 4 MiB hold) made a message of megabytes."""
    from runtime.manifest import check_param_layout

    entry = check_cache(REPO, "sm_90a").kernels["probe_cluster2"]
    with pytest.raises(errors.ParamLayoutError) as e:
        check_param_layout(entry, [(0, 4)] * 262_144, "x.cubin", "sm_90a", ".nv.info")
    assert "262144 parameters, [(0, 4)" in str(e.value) and len(str(e.value)) < 2000


@pytest.mark.parametrize("size", [2 ** 63, 2 ** 45, (4 << 20) + 1])
def test_cubin_size_past_the_bound_is_refused(cache, size):
    """An entry's size bounds the cubin's read: past CUBIN_MAX_BYTES it is refused before any read (it was an
    OverflowError or a MemoryError from os.read)."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(size=size))
    with pytest.raises(errors.SchemaError, match="size"):
        check_cache(cache, "sm_90a")


def test_an_entry_naming_another_variants_cubin_is_refused(cache):
    """probe_cluster8 pointed at probe_cluster2's cubin, with that file's size and sha256: both share the symbol and
    the parameters, so only the file's name shows that the entry would launch another variant."""
    def swap(d):
        first, second = d["kernels"]
        second.update(cubin=first["cubin"], size=first["size"], sha256=first["sha256"])

    edit_manifest(cache, "sm_90a", swap)
    with pytest.raises(errors.PathError, match=r"not the kernel's own file \(probe_cluster8\.cubin\)"):
        check_cache(cache, "sm_90a")


def test_cubin_of_another_elf_encoding_is_refused(cache):
    """A big-endian (or unknown-encoding) ELF header, an ELF32 one, one of another ELF version, one for another
    machine than CUDA or a relocatable object (which the driver cannot load unlinked) is refused before its bytes
    reach the driver."""
    original = first_cubin(cache).read_bytes()
    for at, value, said in ((5, 2, "not a little-endian ELF64"), (5, 0, "not a little-endian ELF64"),
                            (5, 7, "not a little-endian ELF64"), (4, 1, "not a little-endian ELF64"),
                            (6, 2, "not a little-endian ELF64"), (0x12, 62, r"ELF machine 62 is not CUDA \(190\)"),
                            (0x10, 1, r"ELF type 1 is not an executable cubin \(2\): a relocatable object")):
        rewrite_first_cubin(cache, "sm_90a", lambda data, at=at, value=value: data.__setitem__(at, value))
        with pytest.raises(errors.CubinIntegrityError, match=said):
            check_cache(cache, "sm_90a")
        rewrite_first_cubin(cache, "sm_90a", lambda data, at=at: data.__setitem__(at, original[at]))


def test_relative_cache_root_in_the_environment_is_refused(monkeypatch):
    """$SPARSE_DECODE_AOT_CACHE as a relative path would be read against the working directory of each call (a
    chdir later made a loaded cache's next lookup a remembered refusal): refused, naming the variable."""
    from runtime.manifest import CACHE_ROOT_ENV, default_root

    monkeypatch.setenv(CACHE_ROOT_ENV, "relative/cache")
    with pytest.raises(errors.PathError, match=f"\\${CACHE_ROOT_ENV} is the relative path 'relative/cache'"):
        default_root()
    monkeypatch.setenv(CACHE_ROOT_ENV, str(REPO))
    assert default_root() == REPO


@pytest.mark.parametrize("where", ["root", "manifests", "environment"])
def test_a_cache_root_that_is_a_file_is_named_as_such(cache, monkeypatch, where):
    """Loader audit (review-65b): a root (passed in or in $SPARSE_DECODE_AOT_CACHE) naming a file, or a root whose
    manifests/ is a file, was "manifest is not readable JSON (Not a directory)", fixed by building into the file."""
    from runtime.manifest import CACHE_ROOT_ENV

    if where == "manifests":
        shutil.rmtree(cache / "manifests")
        (cache / "manifests").write_text("")
        root = cache
    else:
        root = cache / "manifests" / "sm_90a.json"
    if where == "environment":
        monkeypatch.setenv(CACHE_ROOT_ENV, str(root))
    with pytest.raises(errors.PathError, match=r"sm_90a\.json: a file stands where the cache root's folder .* Fix: "
                                               r"point \$SPARSE_DECODE_AOT_CACHE \(or the root passed in\) at"):
        check_cache(None if where == "environment" else root, "sm_90a")


def test_a_cache_root_with_a_nul_is_a_path_error(cache):
    """Loader audit (review-65b): a root holding a NUL (read from a config file, say) raised pathlib's bare
    ValueError ("embedded null byte"), naming neither the root nor the fix, and no CacheError for the host ops."""
    with pytest.raises(errors.PathError, match="the cache root cannot be resolved .*null byte"):
        check_cache(f"{cache}\0", "sm_90a")


def test_an_empty_cache_root_is_refused_not_read_as_the_current_folder(cache, monkeypatch):
    """A root given as "" (python -m runtime verify --root "$UNSET", runtime.load(os.environ.get(...,""))) is no
    folder: Path("") is the current one, so the cache of whatever folder the command ran in was checked and passed
    (the build refuses an empty --out for the same reason)."""
    monkeypatch.chdir(cache)
    with pytest.raises(errors.PathError, match="cache root passed in is an empty path.* Fix: pass the folder"):
        check_cache("", "sm_90a")


@pytest.mark.parametrize("what", ["manifest", "cubin"])
def test_a_cache_the_serving_user_cannot_read_names_the_access_fix(cache, monkeypatch, what):
    """Loader audit (review-65b): a cache built under umask 077 (folders 0700, files 0600) and served by another user
    was "manifest is not readable JSON (Permission denied)" or "cubin is not a readable file", fixed by a rebuild into
    a root that user cannot write. (Run as root here, where no mode refuses a read: the open's error stands in.)"""
    import errno

    from runtime import manifest

    real_read = manifest._read_regular_file

    def read(path, limit, inside=None):
        if path.endswith(".json") == (what == "manifest"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_read(path, limit, inside)

    monkeypatch.setattr(manifest, "_read_regular_file", read)
    error = errors.SchemaError if what == "manifest" else errors.CubinIntegrityError
    fix = f"let the serving user read the cache root: chmod -R a+rX {cache}"
    with pytest.raises(error, match=rf"{what} cannot be read by this process \(\[Errno 13\] Permission denied.* Fix: "
                                    + re.escape(fix)):
        check_cache(cache, "sm_90a")


def test_a_read_waits_for_a_build_writing_the_cache(cache):
    """A build holds the root's lock exclusively while it writes (build_kernels.write_cache); check_cache (and
    runtime.load, through the same build_settled) reads under it shared: it waits for the writes to end, and
    raises CacheLoadInterrupted, not a refusal, after its wait. Readers do not wait for each other."""
    import threading

    from filelock import FileLock

    from runtime.manifest import BUILD_LOCK, build_settled

    lock_path = str(cache / BUILD_LOCK)
    holding, released = threading.Event(), threading.Event()

    def build():
        with FileLock(lock_path):
            holding.set()
            released.wait(0.3)  # the build's writes
            released.set()  # set before the lock is released: a read that returns must see it

    writer = threading.Thread(target=build)
    writer.start()
    holding.wait()
    with pytest.raises(errors.CacheLoadInterrupted, match="a build has been writing this cache"):
        with build_settled(cache, wait_s=0.05):
            pass
    check_cache(cache, "sm_90a")  # waits for the build's release, then reads a whole cache
    assert released.is_set(), "check_cache read the cache while the build held its lock"
    writer.join()
    with build_settled(cache), build_settled(cache, wait_s=0.05):
        with pytest.raises(TimeoutError):
            FileLock(lock_path).acquire(timeout=0.05)  # the build waits for the readers in turn


def test_a_first_read_creates_the_build_lock(cache):
    """A root never built in place (a fresh checkout) gets the lock file from its first read, so a first build
    that starts during a load waits for it rather than writing unseen."""
    from filelock import FileLock

    from runtime.manifest import BUILD_LOCK, build_settled

    assert not (cache / BUILD_LOCK).exists()
    with build_settled(cache, wait_s=0):
        assert (cache / BUILD_LOCK).exists()
        with pytest.raises(TimeoutError):
            FileLock(str(cache / BUILD_LOCK)).acquire(timeout=0.05)


def test_a_fifo_as_the_build_lock_neither_hangs_the_load_nor_stops_locking(cache):
    """A FIFO named .build.lock: the load's open of the lock waited for a writer forever (a serving process's first
    op call hung, holding the loader's locks). Now it opens; its flock still makes a load wait for a build."""
    import os
    import threading

    from filelock import FileLock

    from runtime.manifest import BUILD_LOCK, build_settled

    lock = cache / BUILD_LOCK
    os.mkfifo(lock)
    done = []
    reader = threading.Thread(target=lambda: done.append(check_cache(cache, "sm_90a")), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        os.close(os.open(lock, os.O_WRONLY | os.O_NONBLOCK))  # a writer comes: the blocked open returns
        reader.join(10)
        pytest.fail("check_cache blocked opening a FIFO build lock")
    assert done and set(done[0].kernels) == {"probe_cluster2", "probe_cluster8"}
    with (
        FileLock(str(lock), timeout=1),  # a build holds it
        pytest.raises(errors.CacheLoadInterrupted, match="a build has been writing this cache"),
        build_settled(cache, wait_s=0.05),
    ):
        pass


def test_a_symlinked_build_lock_creates_nothing_outside_the_root(cache, tmp_path):
    """A .build.lock that is a dangling symlink: the load's O_CREAT created its target, wherever it pointed (the
    symlink attack filelock 3.20.1 closed for the build). Not followed now; the build's filelock refuses such a lock
    too, so no build holds it and the load reads the cache."""
    from runtime.manifest import BUILD_LOCK

    target = tmp_path.parent / f"{tmp_path.name}_made_by_the_load"
    (cache / BUILD_LOCK).symlink_to(target)
    assert set(check_cache(cache, "sm_90a").kernels) == {"probe_cluster2", "probe_cluster8"}
    assert not target.exists()


def test_a_root_where_no_lock_file_can_be_made_is_read_unguarded(cache, monkeypatch):
    """A read-only installed cache (the lock file cannot be created there) has no build to wait for."""
    import os

    from runtime.manifest import BUILD_LOCK

    real_open = os.open

    def read_only_root(path, flags, *args):
        if str(path).endswith(BUILD_LOCK):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only_root)
    check_cache(cache, "sm_90a")
    assert not (cache / BUILD_LOCK).exists()


def test_a_filesystem_without_flock_is_read_unguarded(cache, monkeypatch):
    """flock failing with an OSError other than the build's hold (ENOLCK: no locks on this filesystem, where the
    build's filelock uses a marker file) reads the cache unguarded, as a root without a lock file is."""
    import errno

    from runtime import manifest

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(manifest.fcntl, "flock", no_locks)
    assert set(check_cache(cache, "sm_90a").kernels) == {"probe_cluster2", "probe_cluster8"}


def _installed_layout(monkeypatch, package: Path, prefix: Path, data: Path, user_base: Path) -> None:
    """Stand in for an install: the runtime's package in ``package``, the interpreter's sys.prefix ``prefix``, the
    scheme's data path (sysconfig "data") ``data`` and the user base ``user_base``; no cache root in the
    environment."""
    import site
    import sys
    import sysconfig

    from runtime import manifest

    monkeypatch.delenv(manifest.CACHE_ROOT_ENV, raising=False)
    monkeypatch.setattr(manifest, "__file__", str(package / "runtime/manifest.py"))
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(site, "USER_BASE", str(user_base))
    real_get_path = sysconfig.get_path
    monkeypatch.setattr(sysconfig, "get_path",
                        lambda name, *a, **k: str(data) if name == "data" else real_get_path(name, *a, **k))


def test_no_user_base_is_not_the_working_directory(tmp_path, monkeypatch):
    """Under `python -S` (or an embedded interpreter) site.USER_BASE is None: its "" base made the working directory's
    share/sparse_decode_aot a cache root, a relative path read against whatever the directory is at each call (what
    a relative $SPARSE_DECODE_AOT_CACHE is refused for). A missing user base is now left out."""
    import site

    from runtime import manifest

    usr = tmp_path / "usr"
    _installed_layout(monkeypatch, usr / "lib/python3/site-packages", usr, usr, tmp_path / "home/.local")
    monkeypatch.setattr(site, "USER_BASE", None)
    work = tmp_path / "work"
    copy_probe_cache(work / "share" / "sparse_decode_aot")
    monkeypatch.chdir(work)
    root = manifest.default_root()
    assert root.is_absolute() and root == usr / "share" / "sparse_decode_aot"


def test_installed_data_files_are_found_under_the_schemes_data_path(tmp_path, monkeypatch):
    """pip puts the data files of `pip install .` under the install scheme's data path (sysconfig "data"): Debian's and
    Ubuntu's system Python installs into /usr/local (the package in /usr/local/lib/python3.X/dist-packages, the cache
    in /usr/local/share/sparse_decode_aot) while sys.prefix is /usr, where the runtime looked and found no manifest."""
    from runtime import manifest

    usr = tmp_path / "usr"
    _installed_layout(monkeypatch, usr / "local/lib/python3/dist-packages", usr, usr / "local", tmp_path / "home/.local")
    installed = copy_probe_cache(usr / "local" / "share" / "sparse_decode_aot")
    assert manifest.default_root() == installed


def test_a_user_install_finds_its_own_data_before_the_schemes(tmp_path, monkeypatch):
    """`pip install --user` puts the package in the user site and its data under the user base. A root install into
    the scheme's data path (/usr/local on Debian, of another version) must not be picked over it: the package's own
    data comes first. And where sysconfig cannot name a data path, sys.prefix is looked at as before."""
    import site
    import sysconfig

    from runtime import manifest

    usr, home = tmp_path / "usr", tmp_path / "home/.local"
    user_site = home / "lib/python3/site-packages"
    _installed_layout(monkeypatch, user_site, usr, usr / "local", home)
    monkeypatch.setattr(site, "USER_SITE", str(user_site))
    copy_probe_cache(usr / "local" / "share" / "sparse_decode_aot")  # another install's, in the scheme's data path
    mine = copy_probe_cache(home / "share" / "sparse_decode_aot")
    assert manifest.default_root() == mine

    def no_scheme(name, *a, **k):
        raise KeyError("posix_odd")

    monkeypatch.setattr(sysconfig, "get_path", no_scheme)
    monkeypatch.setattr(manifest, "__file__", str(usr / "lib/python3/site-packages/runtime/manifest.py"))
    at_prefix = copy_probe_cache(usr / "share" / "sparse_decode_aot")
    assert manifest.default_root() == at_prefix


@pytest.mark.parametrize("how", ["--target", "--prefix"])
def test_an_install_outside_the_interpreters_prefix_finds_its_own_data(tmp_path, monkeypatch, how):
    """Loader audit (review-65b): `pip install --target DIR` puts the package in DIR and its data files in DIR/share,
    `pip install --prefix P` the package in P/lib/pythonX.Y/site-packages and the data in P/share (then PYTHONPATH;
    a venv with --system-site-packages over a base install is the same case): the runtime looked under the running
    interpreter's prefixes only, found no manifest there and named a root that holds none."""
    from runtime import manifest

    venv, install = tmp_path / "venv", tmp_path / "opt"
    package = install if how == "--target" else install / "lib/python3.11/site-packages"
    _installed_layout(monkeypatch, package, venv, venv, tmp_path / "home/.local")
    installed = copy_probe_cache(install / "share" / "sparse_decode_aot")
    assert manifest.default_root() == installed


def test_another_packages_manifests_folder_in_site_packages_is_no_cache_root(tmp_path, monkeypatch):
    """Installed, the runtime's package sits in site-packages beside every other distribution's; one that ships a
    top-level ``manifests`` package there made site-packages look like a checkout, and the runtime named it as the
    cache root instead of its own installed data. A root holds manifests/ and cubins/ both."""
    from runtime import manifest

    venv = tmp_path / "venv"
    site_packages = venv / "lib/python3.11/site-packages"
    _installed_layout(monkeypatch, site_packages, venv, venv, tmp_path / "home/.local")
    (site_packages / "manifests").mkdir(parents=True)
    (site_packages / "manifests" / "__init__.py").write_text("")
    installed = copy_probe_cache(venv / "share" / "sparse_decode_aot")
    assert manifest.default_root() == installed
    (site_packages / "cubins").mkdir()  # a checkout's layout (the cache committed beside the runtime) still wins
    assert manifest.default_root() == site_packages


def test_a_cubins_package_alone_or_a_share_folder_of_manifests_alone_is_no_cache_root(tmp_path, monkeypatch):
    """Either folder alone is no root: another distribution's top-level ``cubins`` package in site-packages, or an
    install's share folder left with manifests/ only, is passed over for the next root that holds both."""
    from runtime import manifest

    opt, usr = tmp_path / "opt", tmp_path / "usr"
    site_packages = opt / "lib/python3.11/site-packages"
    _installed_layout(monkeypatch, site_packages, usr, usr, tmp_path / "home/.local")
    (site_packages / "cubins").mkdir(parents=True)
    (site_packages / "cubins" / "__init__.py").write_text("")
    (opt / "share/sparse_decode_aot/manifests").mkdir(parents=True)
    installed = copy_probe_cache(usr / "share" / "sparse_decode_aot")
    assert manifest.default_root() == installed


# --- fifty-first session's review: the block shape a kernel was compiled for -------------------------------------

_REQNTID_128 = b"\x04\x10\x0c\x00" + (128).to_bytes(4, "little") + (1).to_bytes(4, "little") * 2


def _require_block(threads: int, y: int = 1):
    """An edit of a cubin's bytes: its kernel's EIATTR_REQNTID records (128 threads in the committed probes; an sm_100a
    cubin has a second in its capmerc image's list, which must agree) say ``threads`` (and ``y``)."""
    def edit(data):
        for _ in range(bytes(data).count(_REQNTID_128)):
            at = bytes(data).index(_REQNTID_128)
            data[at + 4: at + 12] = threads.to_bytes(4, "little") + y.to_bytes(4, "little")
    return edit


def test_every_committed_kernel_requires_the_manifests_block_shape():
    """Each committed cubin's kernel names the block shape it was compiled for, and it is the manifest's threads."""
    from runtime.cubin import kernel_attributes

    for arch in ("sm_90a", "sm_100a"):
        for entry in check_cache(REPO, arch).kernels.values():
            data = (REPO / entry.cubin).read_bytes()
            assert kernel_attributes(data, entry.symbol).required_block == (entry.threads, 1, 1), (arch, entry.name)
            # The section of that whole name, not one whose name starts with it (another kernel's).
            assert kernel_attributes(data, entry.symbol[:-1]) is None, (arch, entry.name)


@pytest.mark.parametrize("arch, shape", [("sm_90a", (256, 1)), ("sm_100a", (256, 1)), ("sm_90a", (128, 2))])
def test_a_cubin_compiled_for_another_block_shape_is_refused(cache, arch, shape):
    """The manifest's threads were compared with the contract only: a cubin compiled for another block shape passed
    every check of a load, and the driver then refused each launch. It is refused at load, naming both shapes (the
    loader's own path calls the same check after the driver's parameter checks)."""
    from runtime.manifest import check_cubin_against_entry, read_manifest

    rewrite_first_cubin(cache, arch, _require_block(*shape))
    with pytest.raises(errors.BlockShapeError, match=rf"requires blocks of \[{shape[0]}, {shape[1]}, 1\] threads, the "
                                                     r"manifest launches \[128, 1, 1\]"):
        check_cache(cache, arch)
    manifest = read_manifest(cache, arch)
    entry = next(iter(manifest.kernels.values()))
    with pytest.raises(errors.BlockShapeError):
        check_cubin_against_entry(first_cubin(cache, arch).read_bytes(), entry, first_cubin(cache, arch), arch)


def test_the_build_refuses_a_kernel_compiled_for_another_block_shape():
    """The build checks the same against the contract before it writes an entry."""
    import dataclasses

    import build_kernels
    from runtime.contract import all_variants

    variant = next(v for v in all_variants("sm_90a", ("probe",)) if v.name == "probe_cluster2")
    data = (REPO / "cubins" / "sm_90a" / "probe_cluster2.cubin").read_bytes()
    assert build_kernels.manifest_entry(variant, "sm_90a", data)["threads"] == 128
    with pytest.raises(SystemExit, match=r"compiled for blocks of \[128, 1, 1\] threads, the contract launches "
                                         r"\[256, 1, 1\]"):
        build_kernels.manifest_entry(dataclasses.replace(variant, threads=256), "sm_90a", data)


def _decoy_kernel_info(data):
    """A second ``.nv.info.<kernel>`` section ahead of the kernel's own: the ``.nv.info`` section renamed and pointed
    at a copy of the kernel's attribute list without its first parameter record (so it lists one parameter fewer),
    appended to the file (lists sharing bytes are refused as such)."""
    import struct

    from runtime import cubin

    heads, shstrndx = cubin._section_heads(bytes(data))
    strtab = heads[shstrndx][4]
    name_of = {bytes(data[strtab + h[0]: bytes(data).index(b"\0", strtab + h[0])]): i for i, h in enumerate(heads)}
    own = next(i for n, i in name_of.items() if n.startswith(b".nv.info.kernel"))
    decoy = name_of[b".nv.info"]
    assert decoy < own
    start, size = heads[own][4], heads[own][5]
    at = start
    while not (data[at] == 4 and data[at + 1] == 0x17):  # the first EIATTR_KPARAM_INFO record
        at += 4 + (data[at + 2] | data[at + 3] << 8) if data[at] == 4 else 4
    copy = bytes(data[start:at]) + bytes(data[at + 4 + 12: start + size])
    shoff, = struct.unpack_from("<Q", data, 0x28)
    struct.pack_into("<I", data, shoff + decoy * 64, heads[own][0])  # the kernel's section name
    struct.pack_into("<QQ", data, shoff + decoy * 64 + 24, len(data), len(copy))
    data.extend(copy)


def test_a_second_attribute_list_of_the_kernel_is_refused(cache, monkeypatch):
    """Two sections named .nv.info.<kernel>: the load path's parameter count read the first, check_cache's layout the
    last, so a decoy listing a parameter fewer passed the load of a manifest that drops the kernel's last parameter
    (the check the count exists for). Refused as an unreadable ELF by both."""
    from runtime.manifest import check_cubin_against_entry, read_manifest

    rewrite_first_cubin(cache, "sm_90a", _decoy_kernel_info)
    edit_manifest(cache, "sm_90a", drop_last_param)
    contract_follows_the_manifest(monkeypatch, cache)
    entry = next(iter(read_manifest(cache, "sm_90a").kernels.values()))
    with pytest.raises(errors.CubinIntegrityError, match="two sections named .nv.info.kernel"):
        check_cubin_against_entry(first_cubin(cache).read_bytes(), entry, first_cubin(cache), "sm_90a")
    with pytest.raises(errors.CubinIntegrityError, match="two sections named .nv.info.kernel"):
        check_cache(cache, "sm_90a")


def _last_attribute_past_its_section(data):
    """The kernel's last .nv.info record (EIATTR 0x36, 4 bytes in the committed probes) says it holds 8 bytes: its
    value runs past the section's end."""
    at = bytes(data).index(bytes([4, 0x36, 4, 0]))
    data[at + 2] = 8


def test_an_attribute_running_past_its_section_is_refused(cache):
    """A record whose header fits but whose value runs past the section was read short and accepted (only a record
    header past the end was refused): the driver is not trusted to bounds-check the attribute list either."""
    rewrite_first_cubin(cache, "sm_90a", _last_attribute_past_its_section)
    with pytest.raises(errors.CubinIntegrityError, match="attribute runs past its section"):
        check_cache(cache, "sm_90a")


def _global_attribute_past_its_section(data):
    """The last record of the cubin's global .nv.info (EIATTR 0x12, 8 bytes in the committed probes) says it holds
    16 bytes: its value runs past the section's end."""
    at = bytes(data).index(bytes([4, 0x12, 8, 0]))
    data[at + 2] = 16


def test_a_global_attribute_running_past_its_section_is_refused(cache):
    """Loader audit (review-65b): check_cache parsed the kernels' attribute lists but not the global one, which the
    driver reads too; the load now refuses such a cubin before the driver, and check_cache passes none it refuses."""
    rewrite_first_cubin(cache, "sm_90a", _global_attribute_past_its_section)
    with pytest.raises(errors.CubinIntegrityError, match="attribute runs past its section"):
        check_cache(cache, "sm_90a")


# --- sixty-sixth session: the capmerc image's attribute lists of an sm_100a cubin ----------------------------------

def _capmerc_list(name: bytes, fn):
    """An edit of a cubin's bytes: ``fn`` of the bytes of its section ``name`` (a bytearray, edited in place)."""
    def edit(data):
        from runtime.cubin import _section_heads

        heads, shstrndx = _section_heads(bytes(data))
        strtab = heads[shstrndx][4]
        (head,) = [h for h in heads if bytes(data[strtab + h[0] :]).startswith(name + b"\0")]
        body = data[head[4] : head[4] + head[5]]
        fn(body)
        data[head[4] : head[4] + head[5]] = body
    return edit


def _last_record_past_the_end(body):
    """The list's last record (EIATTR 0x12, 8 bytes in the committed probes) says it holds 16."""
    at = bytes(body).rindex(bytes([4, 0x12, 8, 0]))
    body[at + 2] = 16


def _one_parameter_fewer(body):
    """The list's first parameter record (EIATTR_KPARAM_INFO, 0x17) renamed to an attribute no reader knows."""
    at = bytes(body).index(bytes([4, 0x17, 12, 0]))
    body[at + 1] = 0x7F


def test_the_capmerc_images_attribute_lists_are_checked_too(cache):
    """An sm_100a cubin carries its kernel twice: as SASS (.nv.info lists) and as a capmerc image for the driver's
    finalizer, with its own lists (.nv.merc.nv.info*), which the bounds walk skipped and no check compared. A merc
    list running past its section, or one that gives the kernel another parameter count than its .nv.info list (which
    alone is checked against the manifest), is refused by check_cache and by the load's check_section_table."""
    from runtime.cubin import CubinFormatError, check_section_table
    from runtime.manifest import read_manifest

    copy = cache.parent / "pristine"
    copy_probe_cache(copy, archs=("sm_100a",))
    symbol = read_manifest(cache, "sm_100a").kernels[first_cubin(cache, "sm_100a").stem].symbol
    assert check_section_table(first_cubin(cache, "sm_100a").read_bytes(), kernel=symbol).param_count > 0

    rewrite_first_cubin(cache, "sm_100a", _capmerc_list(b".nv.merc.nv.info", _last_record_past_the_end))
    with pytest.raises(errors.CubinIntegrityError, match="attribute runs past its section"):
        check_cache(cache, "sm_100a")
    with pytest.raises(CubinFormatError, match="attribute runs past its section"):
        check_section_table(first_cubin(cache, "sm_100a").read_bytes(), kernel=symbol)

    rewrite_first_cubin(copy, "sm_100a", _capmerc_list(b".nv.merc.nv.info." + symbol.encode(), _one_parameter_fewer))
    with pytest.raises(errors.CubinIntegrityError, match=r"capmerc attribute list \(.nv.merc.nv.info\) says \d+ "):
        check_cache(copy, "sm_100a")
    with pytest.raises(CubinFormatError, match="capmerc attribute list"):
        check_section_table(first_cubin(copy, "sm_100a").read_bytes(), kernel=symbol)


# --- sixty-sixth session's review: what the capmerc checks must not let through ------------------------------------

def _kernel_symbol(root, arch="sm_100a") -> str:
    from runtime.manifest import read_manifest

    return read_manifest(root, arch).kernels[first_cubin(root, arch).stem].symbol


def _merc_required_block(threads: int):
    """The capmerc list's EIATTR_REQNTID record alone says ``threads``: the .nv.info list keeps the manifest's 128."""
    def edit(body):
        at = bytes(body).index(_REQNTID_128)
        body[at + 4 : at + 8] = threads.to_bytes(4, "little")
    return edit


def test_a_capmerc_list_of_another_block_shape_is_refused(cache):
    """The capmerc list must give the kernel's block shape as its .nv.info list does, not its parameter count only:
    the driver refuses a launch of a shape other than the one the image it runs was compiled for."""
    from runtime.cubin import CubinFormatError, check_section_table

    symbol = _kernel_symbol(cache)
    merc = b".nv.merc.nv.info." + symbol.encode()
    rewrite_first_cubin(cache, "sm_100a", _capmerc_list(merc, _merc_required_block(256)))
    with pytest.raises(CubinFormatError, match=r"says 2 parameters, block \(256, 1, 1\), its .nv.info list 2 "):
        check_section_table(first_cubin(cache, "sm_100a").read_bytes(), kernel=symbol)
    with pytest.raises(errors.CubinIntegrityError, match=r"capmerc attribute list .* block \(256, 1, 1\)"):
        check_cache(cache, "sm_100a")


def _first_record_past_the_end(body):
    """The list's first record (EIATTR 0x37, a 4-byte SVAL in the committed probes) says it holds 65532 bytes."""
    assert bytes(body[:4]) == bytes([4, 0x37, 4, 0])
    body[2:4] = b"\xfc\xff"


def test_a_kernels_own_capmerc_list_is_walked_for_a_symbol_it_only_begins_with(cache):
    """check_section_table(kernel=...) leaves the kernel's own lists to its own parse; the name it leaves out ends at
    the NUL, so a list named for a longer symbol that begins with the kernel's (.nv.merc.nv.info.<kernel>X) is still
    walked, and a record of it past its section refused."""
    from runtime.cubin import CubinFormatError, check_section_table

    symbol = _kernel_symbol(cache)
    merc = b".nv.merc.nv.info." + symbol.encode()
    rewrite_first_cubin(cache, "sm_100a", _capmerc_list(merc, _first_record_past_the_end))
    with pytest.raises(CubinFormatError, match="attribute runs past its section"):
        check_section_table(first_cubin(cache, "sm_100a").read_bytes(), kernel=symbol[:-1])


def _section_named_as(target: bytes, renamed: bytes):
    """An edit of a cubin's bytes: section ``renamed``'s header names it as section ``target`` is named."""
    def edit(data):
        import struct

        from runtime.cubin import _section_heads

        heads, shstrndx = _section_heads(bytes(data))
        strtab = heads[shstrndx][4]
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        (shentsize,) = struct.unpack_from("<H", data, 0x3A)
        names = [bytes(data[strtab + h[0] :]).split(b"\0", 1)[0] for h in heads]
        struct.pack_into("<I", data, shoff + names.index(renamed) * shentsize, heads[names.index(target)][0])
    return edit


def test_a_second_capmerc_list_of_the_kernel_is_refused(cache):
    """Two sections named .nv.merc.nv.info.<kernel>: the kernel's own lists are left out of the bounds walk and only
    the first of a name is parsed, so a second would go unread by every check (the load's path has no read_cubin,
    whose own parse refuses two sections of a name)."""
    from runtime.cubin import CubinFormatError, check_section_table

    symbol = _kernel_symbol(cache)
    own = b".nv.merc.nv.info." + symbol.encode()
    rewrite_first_cubin(cache, "sm_100a", _section_named_as(own, b".nv.merc.nv.info"))
    with pytest.raises(CubinFormatError, match=f"two sections named {re.escape(own.decode())}$"):
        check_section_table(first_cubin(cache, "sm_100a").read_bytes(), kernel=symbol)


def test_a_capmerc_list_without_its_nv_info_list_is_refused_as_a_disagreement(cache):
    """A kernel with a capmerc list and no .nv.info list: the two images disagree (the load names both), rather than
    the symbol being absent."""
    from runtime.cubin import CubinFormatError, check_section_table

    symbol = _kernel_symbol(cache)
    rewrite_first_cubin(cache, "sm_100a", sass_list_renamed(symbol))
    with pytest.raises(CubinFormatError, match=r"says 2 parameters, block \(128, 1, 1\), its .nv.info list nothing"):
        check_section_table(first_cubin(cache, "sm_100a").read_bytes(), kernel=symbol)


# --- seventy-sixth session's review: attribute lists read as NVIDIA's tools read them ---------------------------------

def _move_kernel_list(data, new_list: bytes, *, section_type: int | None = None, size: int | None = None) -> None:
    """Point the kernel's .nv.info.<kernel> header at ``new_list``, appended to the file on the 4-byte grid (its type
    and declared size rewritten where given)."""
    import struct

    at = _section_header(data, b".nv.info.kernel")
    data.extend(bytes(-len(data) % 4))
    struct.pack_into("<QQ", data, at + 24, len(data), len(new_list) if size is None else size)
    if section_type is not None:
        struct.pack_into("<I", data, at + 4, section_type)
    data.extend(new_list)


def _kernel_list(data) -> bytes:
    import struct

    start, size = struct.unpack_from("<QQ", data, _section_header(data, b".nv.info.kernel") + 24)
    return bytes(data[start:start + size])


def _param_hidden_behind_a_no_value_record(data):
    """A no-value record (EIFMT_NVAL, 4 bytes to NVIDIA's tools: 2 of padding) whose padding reads, 2 bytes on, as
    the head of a 258-byte record that swallows a third parameter record (ordinal 2) and a padding record: NVIDIA's
    reading finds three parameters, a 2-byte one found two (the manifest's count), and both end on the same byte."""
    import struct

    third = bytes([4, 0x17, 12, 0]) + struct.pack("<IHHI", 0, 2, 0x10, (4 << 18) | 0x1F0)
    region = bytes([1, 0x04, 4, 0x01]) + bytes([2, 0x01, 0, 0]) + third + bytes([4, 0x01, 236, 0]) + bytes(236)
    _move_kernel_list(data, _kernel_list(data) + region)


def test_a_parameter_behind_a_no_value_record_is_counted(cache):
    """A no-value record is 4 bytes, as cuobjdump reads it: read as 2, every later record shifted by 2, and a crafted
    list hid a parameter from the count the load checks against the manifest (the driver is asked only for the
    manifest's parameters), passing check_cache with the third parameter cuobjdump lists."""
    from runtime.cubin import check_section_table
    from runtime.manifest import read_checked_cubin, read_manifest

    rewrite_first_cubin(cache, "sm_90a", _param_hidden_behind_a_no_value_record)
    manifest = read_manifest(cache, "sm_90a")
    entry = next(iter(manifest.kernels.values()))
    assert check_section_table(first_cubin(cache).read_bytes(), kernel=entry.symbol).param_count == 3
    with pytest.raises(errors.ParamLayoutError, match="the manifest lists 2 parameters, the cubin's ELF has 3"):
        read_checked_cubin(manifest, entry, sections=False)  # the load's check
    with pytest.raises(errors.ParamLayoutError, match=r"contradict the cubin's ELF: \[\(0, 8\), \(8, 4\), \(16, 4\)\]"):
        check_cache(cache, "sm_90a")


def _list_as_nobits_past_the_end(data):
    """The kernel's list typed SHT_NOBITS (8), declared 1 MiB longer than the file: exempt from the bounds check."""
    body = _kernel_list(data)
    _move_kernel_list(data, body, section_type=8, size=len(body) + (1 << 20))


def _record_off_the_grid(data):
    """A 2-byte value record (EIFMT_SVAL) ahead of the kernel's list: cuobjdump's "wrong size"."""
    _move_kernel_list(data, bytes([4, 0x01, 2, 0, 0xEE, 0xEE]) + _kernel_list(data))


def _lists_sharing_bytes(data):
    """The global .nv.info header pointed at the kernel's list: one list walked a header, 2 here, N in a file of N."""
    import struct

    start, size = struct.unpack_from("<QQ", data, _section_header(data, b".nv.info.kernel") + 24)
    struct.pack_into("<QQ", data, _section_header(data, b".nv.info\0") + 24, start, size)


@pytest.mark.parametrize("craft, said", [
    (_list_as_nobits_past_the_end, "an attribute list's section is of type 0x8, not 0x70000000"),
    (_record_off_the_grid, "a .nv.info attribute of 2 bytes is off the 4-byte grid"),
    (_lists_sharing_bytes, "two attribute lists share bytes"),
])
def test_attribute_lists_nvidias_tools_refuse_are_refused(cache, craft, said):
    """Attribute lists cuobjdump refuses (a list's section of another type, a record off the 4-byte grid) or that cost
    a walk each for one set of bytes (lists sharing bytes: ~65,000 headers on a 1 MiB list held a load's check for
    about two hours) are refused as an unreadable ELF."""
    rewrite_first_cubin(cache, "sm_90a", craft)
    with pytest.raises(errors.CubinIntegrityError, match=f"not a readable CUDA ELF \\(.*{re.escape(said)}"):
        check_cache(cache, "sm_90a")


def _many_sections(names, size):
    """An edit of a cubin's bytes: a section-name table of the old names then ``names`` (bytes, NUL included, each
    a whole entry or a run whose suffixes the headers name), and a new section table of the old headers plus one
    PROGBITS header per offset in ``names.offsets`` covering the file's first ``size(total)`` bytes."""
    def edit(data):
        import struct

        from runtime.cubin import _SHDR, _section_heads

        heads, shstrndx = _section_heads(bytes(data))
        heads = [list(h) for h in heads]
        old_at, old_size = heads[shstrndx][4], heads[shstrndx][5]
        table, offsets = names
        heads[shstrndx][4:6] = [len(data), old_size + len(table)]
        data.extend(data[old_at : old_at + old_size] + table)
        shoff = len(data)
        total = shoff + 64 * (len(heads) + len(offsets))
        heads += [[old_size + k, 1, 0, 0, 0, size(total), 0, 0, 1, 0] for k in offsets]
        for h in heads:
            data.extend(_SHDR.pack(*h))
        struct.pack_into("<Q", data, 0x28, shoff)
        struct.pack_into("<H", data, 0x3C, len(heads))
    return edit


def test_many_sections_of_the_whole_file_cost_no_copy_each(cache):
    """check_cache's parse (read_cubin) copied every section: 2,000 sections of the whole file but a byte (distinct
    names) held 2,000 copies of it (65,535 of a 1.1 MB cubin: 17 GB, MemoryError); only the attribute lists, which
    share no bytes, are copied now."""
    import tracemalloc

    from runtime.cubin import read_cubin

    table = b"".join(b"s%d\0" % k for k in range(2000))
    offsets = [i + 1 for i, c in enumerate(table) if c == 0][:-1]
    rewrite_first_cubin(cache, "sm_90a", _many_sections((table, [0] + offsets), lambda total: total - 1))
    data = first_cubin(cache).read_bytes()
    tracemalloc.start()
    try:
        assert read_cubin(data).kernels
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * len(data), peak
    check_cache(cache, "sm_90a")


def test_a_section_name_inside_another_is_refused(cache):
    """Headers naming suffixes of one long name have distinct names of the run's length each: 65,000 such sections
    (a 4 MB cubin) had check_cache decode 2 GB of names, quadratic in the file. No cubin shares a name's suffix."""
    table = b"a" * 2000 + b"\0"
    rewrite_first_cubin(cache, "sm_90a", _many_sections((table, range(2000)), lambda total: 0))
    with pytest.raises(errors.CubinIntegrityError, match="a section's name starts inside another name"):
        check_cache(cache, "sm_90a")


# --- review: the capmerc list's parameter layout, and the kernel's entry in the symbol table -------------------------

def test_every_committed_kernel_is_one_global_function_of_its_symbol_table_with_one_layout_in_both_images():
    """What the two checks below take from the committed cubins: each kernel's symbol has one .symtab entry, a global
    function defined in its .text.<symbol> section, and an sm_100a cubin's capmerc list gives its parameters the
    ordinals, offsets and sizes of its .nv.info list (an sm_90a cubin has no capmerc list)."""
    from runtime.cubin import (
        STB_GLOBAL,
        STT_FUNC,
        _section_heads,
        read_cubin,
        symbol_table_entries,
    )
    from runtime.manifest import check_cubin_against_entry

    for arch in ("sm_90a", "sm_100a"):
        manifest = check_cache(REPO, arch)
        for entry in manifest.kernels.values():
            data = (REPO / entry.cubin).read_bytes()
            check_cubin_against_entry(data, entry, REPO / entry.cubin, arch)
            (symbol,) = symbol_table_entries(data, entry.symbol)
            assert (symbol.binding, symbol.type, symbol.defined) == (STB_GLOBAL, STT_FUNC, True), (arch, entry.name)
            heads, shstrndx = _section_heads(data)
            text = b".text." + entry.symbol.encode() + b"\0"
            assert data.startswith(text, heads[shstrndx][4] + heads[symbol.section][0]), (arch, entry.name)
            info = read_cubin(data)
            assert info.capmerc == ({entry.symbol: info.kernels[entry.symbol]} if arch == "sm_100a" else {}), entry.name


def _merc_param(which: int, **fields):
    """An edit of a capmerc list's bytes: its EIATTR_KPARAM_INFO record of parameter ``which`` (its ordinal) takes the
    given ``ordinal``, ``offset`` or ``size`` (the .nv.info list keeps the manifest's)."""
    def edit(body):
        import struct

        at = bytes(body).index(bytes([4, 0x17, 12, 0, 0, 0, 0, 0]) + which.to_bytes(2, "little"))
        index, old_ordinal, offset, bits = struct.unpack_from("<IHHI", body, at + 4)
        size = fields.get("size", (bits >> 18) & 0x3FFF)
        bits = (bits & ~(0x3FFF << 18)) | size << 18
        struct.pack_into("<IHHI", body, at + 4, index, fields.get("ordinal", old_ordinal),
                         fields.get("offset", offset), bits)
    return edit


@pytest.mark.parametrize("fields, said", [
    ({"offset": 200}, "(1, 200, 4)"),
    ({"size": 8}, "(1, 8, 8)"),
    ({"ordinal": 5}, "(5, 8, 4)"),
])
def test_a_capmerc_parameter_of_another_layout_is_refused(cache, fields, said):
    """The capmerc list was compared with the .nv.info list in its parameter count and block shape only: its second
    parameter at offset 200 (or of 8 bytes, or of ordinal 5) passed check_cache. Refused as a ParamLayoutError naming
    the parameter and both values."""
    from runtime.manifest import check_cubin_against_entry, read_manifest

    merc = b".nv.merc.nv.info." + _kernel_symbol(cache).encode()
    rewrite_first_cubin(cache, "sm_100a", _capmerc_list(merc, _merc_param(1, **fields)))
    message = rf"kernel probe_cluster2: .* gives parameter 1 \(seed\) \(ordinal, offset, size\) {re.escape(said)}, " \
              r"its .nv.info list \(1, 8, 4\)"
    with pytest.raises(errors.ParamLayoutError, match=message):
        check_cache(cache, "sm_100a")
    entry = read_manifest(cache, "sm_100a").kernels["probe_cluster2"]
    with pytest.raises(errors.ParamLayoutError, match=message):
        check_cubin_against_entry(first_cubin(cache, "sm_100a").read_bytes(), entry, first_cubin(cache, "sm_100a"),
                                  "sm_100a")


def _symtab_header(data) -> int:
    """The file offset of the section header of the ELF's .symtab."""
    return _section_header(data, b".symtab\0")


def _kernel_symbol_entry(data) -> int:
    """The file offset of the kernel's .symtab entry (a global function: info 0x12, the probes' eighth entry)."""
    import struct

    start, size = struct.unpack_from("<QQ", data, _symtab_header(data) + 24)
    (at,) = [start + k for k in range(0, size, 24) if data[start + k + 4] == 0x12]
    return at


def _kernel_symbol_field(offset: int, fmt: str, value):
    """An edit of a cubin's bytes: the field at ``offset`` of the kernel's .symtab entry (4: info, 6: section) packed
    as ``fmt`` holds ``value`` (a function of the ELF's section count where callable)."""
    def edit(data):
        import struct

        (shnum,) = struct.unpack_from("<H", data, 0x3C)
        struct.pack_into(fmt, data, _kernel_symbol_entry(data) + offset, value(shnum) if callable(value) else value)
    return edit


def _kernel_symbol_nameless(data):
    """The kernel's .symtab entry named by the table's first byte (the empty name)."""
    data[_kernel_symbol_entry(data) : _kernel_symbol_entry(data) + 4] = bytes(4)


def _second_entry_of_the_kernels_name(data):
    """The .debug_frame section's symbol (a local STT_SECTION entry) named as the kernel is."""
    import struct

    start, size = struct.unpack_from("<QQ", data, _symtab_header(data) + 24)
    (debug_frame,) = [start + k for k in range(0, size, 24) if data[start + k + 4] == 3
                      and bytes(data).startswith(b".debug_frame\0", _strtab(data) + struct.unpack_from("<I", data,
                                                                                                       start + k)[0])]
    data[debug_frame : debug_frame + 4] = data[_kernel_symbol_entry(data) : _kernel_symbol_entry(data) + 4]


def _strtab(data) -> int:
    import struct

    return struct.unpack_from("<Q", data, _section_header(data, b".strtab\0") + 24)[0]


def _symtab_field(offset: int, fmt: str, value):
    """An edit of a cubin's bytes: the field at ``offset`` of .symtab's section header (4: type, 32: size, 40: link,
    56: entsize) packed as ``fmt`` holds ``value`` (a function of the old value and the ELF's section count)."""
    def edit(data):
        import struct

        at = _symtab_header(data) + offset
        (old,) = struct.unpack_from(fmt, data, at)
        (shnum,) = struct.unpack_from("<H", data, 0x3C)
        struct.pack_into(fmt, data, at, value(old, shnum))
    return edit


def _strtab_unterminated(data):
    """The .strtab's last byte (its last name's NUL) an "x"."""
    import struct

    start, size = struct.unpack_from("<QQ", data, _section_header(data, b".strtab\0") + 24)
    data[start + size - 1] = ord("x")


def _symbol_name_past_its_table(data):
    """The kernel's .symtab entry names the byte just past .strtab (in the file: .symtab follows it)."""
    import struct

    _start, size = struct.unpack_from("<QQ", data, _section_header(data, b".strtab\0") + 24)
    struct.pack_into("<I", data, _kernel_symbol_entry(data), size)


def _typed_symtab(section: bytes):
    """An edit of a cubin's bytes: section ``section`` typed SHT_SYMTAB, a second symbol table."""
    def edit(data):
        import struct

        struct.pack_into("<I", data, _section_header(data, section + b"\0") + 4, 2)
    return edit


@pytest.mark.parametrize("craft, said", [
    (_kernel_symbol_nameless, r"\(.symtab\) has no entry named it: the driver finds kernel symbol '\w+' by name"),
    (_symtab_field(4, "<I", lambda old, shnum: 1), r"the cubin has no symbol table \(.symtab\)"),
    (_second_entry_of_the_kernels_name, r"\(.symtab\) has 2 entries named '\w+', a kernel symbol has one"),
    (_kernel_symbol_field(4, "<B", 0x11), r"as binding 1, type 1 in section \d+, not as a global or weak function"),
    (_kernel_symbol_field(4, "<B", 0x02), r"as binding 0, type 2 in section \d+, not"),
    (_kernel_symbol_field(6, "<H", 0), r"as binding 1, type 2 in section 0 \(none of the ELF\), not"),
    (_kernel_symbol_field(6, "<H", lambda shnum: shnum), r"as binding 1, type 2 in section \d+ \(none of the ELF\)"),
    (_kernel_symbol_field(6, "<H", 0xFFF1), r"as binding 1, type 2 in section 65521 \(none of the ELF\)"),  # SHN_ABS
])
def test_a_kernel_symbol_the_symbol_table_does_not_define_once_as_a_function_is_refused(cache, craft, said):
    """The symbol was looked for in the attribute lists' section names (.nv.info.<symbol>) only: a cubin whose symbol
    table has no entry of it, two, or one that is no global or weak function defined in a section passed check_cache,
    while the driver looks the kernel up by name in the symbol table. Refused as a SymbolError."""
    rewrite_first_cubin(cache, "sm_90a", craft)
    with pytest.raises(errors.SymbolError, match=said):
        check_cache(cache, "sm_90a")


def test_a_weak_kernel_symbol_passes(cache):
    """A weak definition (STB_WEAK, as a template kernel's may be) is one the driver finds by name too."""
    rewrite_first_cubin(cache, "sm_90a", _kernel_symbol_field(4, "<B", 0x22))
    check_cache(cache, "sm_90a")


@pytest.mark.parametrize("arch, craft, said", [
    ("sm_90a", _symtab_field(56, "<Q", lambda old, shnum: 16), "symbol table entry size 16 is not ELF64's 24"),
    ("sm_90a", _symtab_field(32, "<Q", lambda old, shnum: old + 4), "are not whole 24-byte entries"),
    ("sm_90a", _symtab_field(40, "<I", lambda old, shnum: shnum), "string table (section"),
    ("sm_90a", _symtab_field(40, "<I", lambda old, shnum: 3), "string table (section 3) is no string table section"),
    ("sm_90a", _strtab_unterminated, "the symbol table's string table does not end in a NUL"),
    ("sm_90a", _symbol_name_past_its_table, "a symbol's name lies past its string table"),
    ("sm_90a", _typed_symtab(b".debug_frame"), "2 symbol tables (SHT_SYMTAB sections), ELF allows one"),
    ("sm_100a", _typed_symtab(b".nv.merc.symtab"), "2 symbol tables (SHT_SYMTAB sections), ELF allows one"),
])
def test_a_symbol_table_that_cannot_be_read_is_a_typed_error(cache, arch, craft, said):
    """The symbol table is read through its sh_link, every offset and size checked: a crafted one is an unreadable
    ELF (CubinIntegrityError), not an IndexError or struct.error, nor a name read past its table."""
    rewrite_first_cubin(cache, arch, craft)
    with pytest.raises(errors.CubinIntegrityError, match=f"not a readable CUDA ELF \\(.*{re.escape(said)}"):
        check_cache(cache, arch)


def test_every_byte_of_the_symbol_table_and_its_headers_altered_is_read_or_refused_as_a_format_error(cache):
    """Each byte of .symtab, its section header and its string table's header set to 0x00, 0x80 and 0xff in turn:
    symbol_table_entries reads it or raises CubinFormatError, nothing else."""
    import struct

    from runtime.cubin import CubinFormatError, symbol_table_entries

    symbol = _kernel_symbol(cache, "sm_90a")
    data = first_cubin(cache).read_bytes()
    start, size = struct.unpack_from("<QQ", data, _symtab_header(data) + 24)
    spans = [range(start, start + size), range(_symtab_header(data), _symtab_header(data) + 64),
             range(_section_header(data, b".strtab\0"), _section_header(data, b".strtab\0") + 64)]
    outcomes = set()
    for at in (i for span in spans for i in span):
        for value in (0x00, 0x80, 0xFF):
            mutant = bytearray(data)
            mutant[at] = value
            try:
                found = symbol_table_entries(bytes(mutant), symbol)
                outcomes.add("read" if found is None else len(found))
            except CubinFormatError:
                outcomes.add("refused")
    assert {"refused", 0, 1} <= outcomes, outcomes


def test_names_sharing_bytes_cost_no_decode_each(cache):
    """ELF names may share bytes (one name a suffix of another): 50,000 symbols naming suffixes of one 1 MB name are
    compared with the kernel's symbol where they lie, linear in the file, not decoded (25 GB of names)."""
    import struct
    import time

    from runtime.cubin import symbol_table_entries

    def edit(data):
        """A new .strtab (one long name) and a new .symtab of a global function per suffix, appended."""
        names = b"\0" + b"k" * (1 << 20) + b"\0"
        strtab = _section_header(data, b".strtab\0")
        data.extend(bytes(-len(data) % 8))
        struct.pack_into("<QQ", data, strtab + 24, len(data), len(names))
        data.extend(names)
        data.extend(bytes(-len(data) % 8))
        table = b"".join(struct.pack("<IBBHQQ", 1 + k * 20, 0x12, 0, 1, 0, 0) for k in range(50_000))
        struct.pack_into("<QQ", data, _symtab_header(data) + 24, len(data), len(table))
        data.extend(table)

    rewrite_first_cubin(cache, "sm_90a", edit)
    data = first_cubin(cache).read_bytes()
    began = time.perf_counter()
    assert symbol_table_entries(data, _kernel_symbol(cache, "sm_90a")) == ()
    assert symbol_table_entries(data, "k" * 1000) == ()  # a name runs to the NUL: none is 1,000 k's long
    assert len(symbol_table_entries(data, "k" * ((1 << 20) - 49_999 * 20))) == 1  # the last suffix's name
    assert time.perf_counter() - began < 2.0
    with pytest.raises(errors.SymbolError, match="has no entry named it"):
        check_cache(cache, "sm_90a")
