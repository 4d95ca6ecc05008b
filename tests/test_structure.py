"""Structural checks of the committed cubins of both archs: what the probe must contain to prove
clusters, DSMEM stores with mbarrier completion and programmatic dependent launch; what the PDL kernels may touch
before their dependency wait; the instructions that carry sparse MLA's recipe."""

import json
import re
from pathlib import Path

import pytest
from sass import cuobjdump, opcode_sequence, opcodes, resource_usage, sass

from runtime.contract import all_variants
from runtime.manifest import manifest_path

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump missing (pip install -e '.[test]')")

PROBE_SASS = {
    "UCGABAR_ARV", "UCGABAR_WAIT",  # cluster barrier
    "STAS",  # st.async into a peer CTA's shared memory
    "SYNCS.ARRIVE.TRANS64",  # mbarrier arrive with expected transaction bytes
    "SYNCS.PHASECHK.TRANS64.TRYWAIT",  # mbarrier wait
    "ACQBULK",  # griddepcontrol.wait
    "PREEXIT",  # griddepcontrol.launch_dependents
}


def entries(arch, family):
    data = json.loads(manifest_path(REPO, arch).read_text())
    return [k for k in data["kernels"] if k["family"] == family]


def every_variant(arch, family):
    """entries(arch, family), asserted to hold every variant of the contract's family for the arch: a loop over them
    checks nothing where the manifest names the family otherwise or lacks some of its kernels."""
    found = entries(arch, family)
    assert sorted(k["name"] for k in found) == sorted(v.name for v in all_variants(arch, (family,))), (arch, family)
    return found


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_probe_sass_has_cluster_dsmem_and_pdl(arch):
    found = entries(arch, "probe")
    assert {k["name"] for k in found} == {"probe_cluster2", "probe_cluster8"}
    for k in found:
        missing = PROBE_SASS - opcodes(str(REPO / k["cubin"]))
        assert not missing, (arch, k["name"], missing)
        # What lets run_probe see PDL's order: the dependents released first, out read and written only after the
        # dependency wait.
        lines = opcode_sequence(str(REPO / k["cubin"]))
        release, wait = lines.index("PREEXIT"), lines.index("ACQBULK")
        accesses = [i for i, op in enumerate(lines) if op.startswith(GLOBAL_ACCESS)]
        assert release < wait < min(accesses), (arch, k["name"], lines)
        assert [lines[i].split(".")[0] for i in accesses] == ["LDG", "STG"], (arch, k["name"], lines)
        # The load before the hold (its globaltimer reads, S2UR): a read moved past it would meet the previous
        # grid's write at the same moment, and the probe would no longer tell a missing wait.
        timer = next(i for i in range(wait, len(lines)) if lines[i] == "S2UR")
        assert accesses[0] < timer < accesses[1], (arch, k["name"], lines)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_empty_kernels_are_empty(arch):
    for k in every_variant(arch, "empty"):
        ops = opcodes(str(REPO / k["cubin"]))
        assert ops <= {"EXIT", "BRA", "NOP", "LDC", "LDCU"}, (k["name"], ops)  # a constant load at most


# Global loads, stores and atomics (generic LD/ST/ATOM included), and the bulk and TMA copies from global memory
# (UBLKCP.S.G: cp.async.bulk, which decode_topk's FP32 tiles use; UTMALDG: a TMA tile load).
GLOBAL_ACCESS = ("LDG", "STG", "ATOMG", "ATOM.", "RED.", "LD.", "ST.", "LDGSTS", "UBLKCP", "UTMALDG")


def global_accesses_before_wait(kernel, allowed=()):
    """The global-memory instructions of a PDL kernel's SASS before griddepcontrol.wait (ACQBULK), leaving out
    those starting with one of ``allowed``; the kernel must also release its dependents (PREEXIT)."""
    lines = opcode_sequence(str(REPO / kernel["cubin"]))
    assert "ACQBULK" in lines and "PREEXIT" in lines, kernel["name"]
    before = lines[:lines.index("ACQBULK")]
    return [op for op in before if op.startswith(GLOBAL_ACCESS) and not op.startswith(tuple(allowed))]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_decode_topk_waits_before_any_global_access(arch):
    """decode_topk is launched with programmatic dependent launch: its logits, row ends and
    output rows may still be in the previous grid's hands until griddepcontrol.wait (ACQBULK)."""
    for k in every_variant(arch, "decode_topk"):
        assert k["pdl"], k["name"]
        touched = global_accesses_before_wait(k)
        assert not touched, (arch, k["name"], touched)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_topk_pool_rows_waits_then_loads_two_words_and_stores_one(arch):
    """topk_pool_rows is launched with programmatic dependent launch after the top-k kernel that writes its
    positions: no global access before griddepcontrol.wait (ACQBULK), the dependents released (PREEXIT), and then
    a thread's whole map: its position, its page id (the gather), its row, as single 32-bit accesses, with no shared
    memory or barrier (one kernel where the torch chain was thirteen)."""
    for k in every_variant(arch, "topk_pool_rows"):
        assert k["pdl"] and k["smem_bytes"] == 0, k["name"]
        assert not global_accesses_before_wait(k), (arch, k["name"])
        lines = opcode_sequence(str(REPO / k["cubin"]))
        assert [op for op in lines if op.startswith(GLOBAL_ACCESS)] == ["LDG.E", "LDG.E", "STG.E"], (arch, lines)
        assert not {op for op in lines if op.startswith(("LDS", "STS", "BAR", "ATOM", "RED"))}, (arch, lines)


def test_sparse_mla_reads_only_constant_weights_before_the_dependency_wait():
    """sparse_mla_decode is launched with programmatic dependent launch: before griddepcontrol.wait (ACQBULK)
    it may read the sinks (weights of the model, LDG.E.CONSTANT) and nothing the previous grid writes. The
    constant loads are counted too, so that a non-coherent load of a grid-produced input (the query, indices) cannot
    pass for a sink read: none where the variant has no sinks, one where it has them (a cluster's owner head's;
    width 128's 16 threads' one head each, stored to shared memory before the wait)."""
    found = entries("sm_90a", "sparse_mla_decode")
    assert len(found) == 4
    for k in found:
        touched = global_accesses_before_wait(k, allowed=("LDG.E.CONSTANT",))
        assert not touched, (k["name"], touched)
        sink_loads = global_accesses_before_wait(k).count("LDG.E.CONSTANT")
        assert sink_loads == (1 if k["config"]["has_sinks"] else 0), (k["name"], sink_loads)


# What issue 3 asks of the sm_90a kernel, by the instructions that carry it out: FP8 WGMMA with FP32 accumulation
# (QGMMA ... F32.E4M3.E4M3) for both products, the gather by asynchronous copies (LDGSTS), the softmax in base 2
# (MUFU.EX2), BF16 stores, and with n > 1 CTAs a cluster the statistics exchanged through distributed shared memory
# (STAS with mbarrier completion) and the partial outputs moved by bulk copies between CTAs (UBLKCP.S.S).
MLA_EVERY_WIDTH = {"LDGSTS.E.BYPASS.128", "MUFU.EX2", "F2FP.BF16.F32.PACK_AB", "ACQBULK", "PREEXIT"}
MLA_CLUSTER = {"UCGABAR_ARV", "UCGABAR_WAIT", "STAS.64", "UBLKCP.S.S", "SYNCS.ARRIVE.TRANS64",
               "SYNCS.PHASECHK.TRANS64.TRYWAIT"}
MLA_MMA = "QGMMA.64x16x32.F32.E4M3.E4M3"
# A chunk's 128 rows x 512 dims against 16 heads: 2 row blocks x 16 K steps of 32 for the scores, and 512 / 64 dim
# blocks x 128 / 32 K steps for P V: 32 MMAs each.
MLA_MMAS_PER_PRODUCT = 32


@pytest.mark.parametrize("width", [128, 640])
def test_sparse_mla_sass_carries_the_issue_recipe(width):
    """The kernel's instructions, not only its results: a rebuild that fell back to other MMAs, loads or a
    cluster-less reduction would still pass the value tests, at another speed. The dependents are released
    (PREEXIT) once the 32 score MMAs are issued, before the first wait on them, as the issue places it."""
    for k in every_variant("sm_90a", "sparse_mla_decode"):
        if k["config"]["width"] != width:
            continue
        cubin = str(REPO / k["cubin"])
        ops = opcodes(cubin)
        expected = MLA_EVERY_WIDTH | (MLA_CLUSTER if width > 128 else set())
        assert not expected - ops, (k["name"], expected - ops)
        if width == 128:  # one CTA a token: nothing to exchange
            assert not MLA_CLUSTER & ops, (k["name"], MLA_CLUSTER & ops)
        text = sass(cubin)
        mmas = re.findall(r"\bQGMMA\.\S+", text)
        assert set(mmas) == {MLA_MMA} and len(mmas) == 2 * MLA_MMAS_PER_PRODUCT, (k["name"], sorted(set(mmas)))
        lines = opcode_sequence(cubin)
        release = lines.index("PREEXIT")
        assert sum(op.startswith("QGMMA") for op in lines[:release]) == MLA_MMAS_PER_PRODUCT, k["name"]
        assert not any(op.startswith("WARPGROUP.DEPBAR") for op in lines[:release]), k["name"]


DSMEM_EXCHANGE = {"UCGABAR_ARV", "UCGABAR_WAIT", "STAS"}  # the cluster barrier and stores into a peer CTA


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_decode_topk_clusters_exchange_through_distributed_shared_memory(arch):
    """Of every decode_topk variant (sm_100a's verified here by structure only, as they cannot run): those whose
    manifest entry says a row spans a cluster of n > 1 CTAs exchange through the cluster barrier and DSMEM stores;
    one CTA a row (n = 1, the short-row kernel) carries none, so a manifest whose cluster shape disagrees with the
    code it names fails here."""
    for k in every_variant(arch, "decode_topk"):
        ops = opcodes(str(REPO / k["cubin"]))
        n = k["config"]["cluster"]
        assert k["cluster"] == [n, 1, 1], k["name"]
        if n > 1:
            assert not DSMEM_EXCHANGE - ops, (arch, k["name"], DSMEM_EXCHANGE - ops)
        else:
            assert not DSMEM_EXCHANGE & ops, (arch, k["name"], DSMEM_EXCHANGE & ops)


# What an SM of both archs holds (sm_90 and sm_100 alike): 64K 32-bit registers, allocated 256 a warp; 228 KiB of
# shared memory, of which each CTA also takes 1 KiB for the system; 2048 threads; 32 CTAs.
SM_REGISTERS, REGISTER_UNIT, SM_SHARED, CTA_RESERVED_SHARED, SM_THREADS, SM_CTAS = 65536, 256, 233472, 1024, 2048, 32


def resident_ctas(kernel) -> int:
    """CTAs of ``kernel`` an SM holds at once, from its cubin's registers and static shared memory and its
    manifest's threads and dynamic shared memory (the occupancy calculator's rules; the static count is added on top
    of the reserved kilobyte, which only errs low)."""
    usage = resource_usage(str(REPO / kernel["cubin"]))
    warps = -(-kernel["threads"] // 32)
    warp_registers = -(-usage["REG"] * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = SM_REGISTERS // warp_registers // warps if warp_registers else SM_CTAS
    by_shared = SM_SHARED // (kernel["smem_bytes"] + usage["SHARED"] + CTA_RESERVED_SHARED)
    return min(by_registers, by_shared, SM_THREADS // kernel["threads"], SM_CTAS)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_cubins_fit_the_ctas_an_sm_their_variants_are_built_for(arch):
    """The occupancy each variant is routed and sized by, from what its cubin uses (sm_100a's verified here only):
    decode_topk's ``ctas_per_sm`` (two where its routing counts two CTAs an SM; a cubin one register a thread over
    64 would hold one, and halve its waves with no error), and sparse MLA's two CTAs an SM (issue 3)."""
    for family in ("decode_topk", "sparse_mla_decode"):
        if arch == "sm_100a" and family == "sparse_mla_decode":
            continue  # a Hopper WGMMA kernel: no sm_100a variant
        for k in every_variant(arch, family):
            wanted = k["config"]["ctas_per_sm"] if family == "decode_topk" else 2
            assert resident_ctas(k) >= wanted, (arch, k["name"], resource_usage(str(REPO / k["cubin"])), wanted)
