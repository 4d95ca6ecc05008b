"""The self-test family: proves a cache works on a GPU (clusters, DSMEM, PDL).

Each CTA of a cluster of n first releases its dependents (griddepcontrol.launch_dependents, so the next launch
runs beside this one), stores a word into the shared memory of the next CTA of its cluster (st.async, completing
on that CTA's mbarrier), waits for the word from its predecessor, waits on the grid dependency, reads
``out[block]``, holds ~20 us, then writes ``out[block] += word + seed`` where ``word = 1000 * (predecessor's rank
+ 1) + block of the predecessor``. The host launches twice on one buffer and checks every element: the second
launch adds to the first's words only where its dependency wait kept its read behind them.
"""

from . import Variant, params

PARAMS = params("void* out", "int32_t seed")
POINTER_ALIGN = {"out": 16}  # runtime.probe allocates its out (torch's allocations are 512-byte aligned)


def _variant(cluster: int) -> Variant:
    return Variant(
        family="probe",
        name=f"probe_cluster{cluster}",
        params=PARAMS,
        threads=128,
        cluster=(cluster, 1, 1),
        smem_bytes=128,  # an mbarrier and the received word
        pdl=True,
        config=(("cluster", cluster),),
    )


VARIANTS = (_variant(2), _variant(8))
