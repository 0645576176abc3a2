"""The recurrent pools of an allocated cache as the kernels see them: per layer, the R (conv) and S (state) pool
viewed as rows x the kernel's row shape (rows = cells x planes, plan.recurrent.rows), and the report's bytes
planned and allocated per cache kind (k, v, r, s).
"""

from __future__ import annotations

from typing import Any

from rsplan.profiler.alloc import AllocatedCache
from rsplan.profiler.families import Family
from rsplan.profiler.result import Allocation, KindAllocation


def allocation_report(plan: Any, cache: AllocatedCache) -> Allocation:
    """Bytes planned and allocated per cache kind, and the number of tensors."""
    kinds = {kind: KindAllocation(cache.planned_bytes[kind], cache.allocated_bytes[kind]) for kind in "kvrs"}
    return Allocation(kinds, len(cache.tensors))


def pool_views(plan: Any, cache: AllocatedCache, family: Family) -> dict[int, dict[str, Any]]:
    """layer -> {"r": conv pool view, "s": state pool view} for the kinds the family's kernels use."""
    rows = plan.recurrent.rows
    shapes = {k.kind: k.row_shape for k in family.kernels}
    pools: dict[int, dict[str, Any]] = {}
    for t in plan.tensors:
        if t.kind in shapes:
            pools.setdefault(t.layer, {})[t.kind] = cache.tensors[t.name].view(rows, *shapes[t.kind])
    return pools


def zero_pools(pools: dict[int, dict[str, Any]]) -> None:
    """Zero every pool view (before each engine is built: a probe or a workload starts from zeroed states)."""
    for layer_pools in pools.values():
        for pool in layer_pools.values():
            pool.zero_()
