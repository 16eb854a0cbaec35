"""How many new nodes a flavor needs for the requests that only capacity holds back."""

from __future__ import annotations

from collections.abc import Iterable


def nodes_needed(sizes: Iterable[int], gpus_per_node: int, provisioning: int, limit: int) -> int:
    """New nodes to ask for so that requests of `sizes` GPUs can each be placed on one node.

    First-fit decreasing over the `provisioning` nodes already on their way, then over new
    ones; never more than `limit` new nodes. Sizes wider than a node are skipped: no node
    of this flavor will ever hold them.
    """
    free = [gpus_per_node] * provisioning
    new = 0
    for size in sorted(sizes, reverse=True):
        if size > gpus_per_node:
            continue
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                break
        else:
            if new >= limit:
                break
            new += 1
            free.append(gpus_per_node - size)
    return new
