"""An empty kernel per cluster shape: the launch-overhead part of a benchmark's floor.

A benchmark's floor is this kernel launched with the measured kernel's grid and
cluster shape, plus the bytes the kernel must move over the measured copy
bandwidth (DESIGN.md, "Measuring speed").
"""

from . import Variant, params

CLUSTER_SIZES = (1, 2, 4, 5, 8, 16)


def name_for(cluster: int) -> str:
    return f"empty_cluster{cluster}"


VARIANTS = tuple(
    Variant(
        family="empty",
        name=name_for(n),
        params=params("int32_t unused"),
        threads=128,
        cluster=(n, 1, 1),
        config=(("cluster", n),),
    )
    for n in CLUSTER_SIZES
)
