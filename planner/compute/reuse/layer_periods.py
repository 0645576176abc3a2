"""Reserve graphs built over fewer layers: the middle of a run of repeating layers left out, and proven not to
matter for the compute buffers, the splits and the host ops at each sizing.

Most models repeat a pattern of layers (Qwen3-Next: three gated-delta-net layers, then one attention layer, twelve
times). Layers alike in everything their graph depends on (``layer_signature``: the hyper-parameters the graph
builders read per layer, the layer's device and its cache's device, and whether it is the first or the last
layer) build twin sub-graphs: the same ops, types, shapes and strides, their sources at the same relative
positions. ``layer_cut`` finds the longest run of layers whose signatures repeat with a period of N layers
(N = 1 to 8) and keeps, of its R periods, the first three (p0, p1, p2) and the last (p_last): the graph is built
over the other layers only (planner.compute.graphs.common.GraphParams.layers), with R - 4 periods left out, where R - 4
is at least 1. The allocator's state often repeats over a multiple of the model's period (``LayerCut.times``:
every 3 layers in Mamba-2's pp graph, every 2 in its tg graph): planner.compute.per_device tries the multiples in turn.

Why the sizes come out as the whole graph's, or the sizing falls back to the whole graph:

- **Scheduler** (planner.compute.sched_split.split_graph: ``_whole_graph_host_ops``, ``_whole_graph_splits``). The nodes
  of p0, p1, p2 and p_last must get the same backends at the same relative positions, p1, p2 and p_last the same split
  starts (backends and input counts at the same positions), p1 and p2 the same ops left to the host, and p1, p2 the same
  length once the split has put its input copies in. Each period then holds nodes that pass 1 assigns from their weights
  (every layer reads a norm weight), so every expansion pass enters a period with the backend that the period before (or
  after) ends with: the left-out periods, twins of p2 between twins of p2, are assigned, split and copied as p2 is, and
  the whole graph has ``n_splits + skipped x (p2's splits)`` splits and ``skipped x (p2's host ops)`` more host ops.
  Only setups whose weights' buffers the layer's device decides are cut (no ``-ot``, no file type the devices refuse, no
  weight copied to another backend), so the signature holds every buffer decision. tests/planner/test_layer_periods.py
  checks on every preset's whole graphs that each left-out period builds p2's nodes.
- **Allocator** (planner.ggml.alloc ``_Periods``). ggml-alloc's next step depends only on its state: each
  buffer's free blocks, and where each live tensor is (buffer, offset, size; the consumers and views left are
  the graph's structure). At the starts of p1, p2 and p_last the state must be the same: equal free blocks, and
  the live tensors mapped onto each other one period on (a tensor of the periods to its twin a period later, a
  tensor from before them to itself). Then in the whole graph p2 leaves the state as it found it, every
  left-out period starts in it and repeats p2's allocations at p2's offsets (no higher water mark), and p_last
  starts in it as in the cut graph: every buffer's high-water mark is the cut graph's. A tensor from before the
  periods that the left-out periods would free is caught too: it is live at p2's start and not at p_last's.
  The state is checked at every sizing (the allocator's walk and each replay at another context); where it
  differs, that sizing is made on the whole graph.

``ENABLED`` is the switch (``RSPLAN_LAYER_PERIODS=0`` at import turns it off), for comparisons of the two paths.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rsplan.hparams.layout import CacheLayout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.weights.placement import Placement

#: Whether reserve graphs are built over fewer layers where the layers repeat (module docstring).
ENABLED = os.environ.get("RSPLAN_LAYER_PERIODS") != "0"
#: Periods of the run kept before the cut (p0, p1, p2): p1 and p2 are checked against each other, p0 gives p1
#: a period before it.
KEPT_BEFORE = 3
#: The longest period looked for, in layers.
MAX_PERIOD = 8


@dataclass(frozen=True)
class LayerCut:
    """The layers a cut graph is built over: of a run of layers ``first`` .. ``end - 1`` that repeats every
    ``period`` layers (of ``n_layer``), the first KEPT_BEFORE periods (p0, p1, p2) and the run's last whole period
    (p_last) are kept, with every layer outside the run."""

    first: int
    end: int
    period: int
    n_layer: int

    @property
    def skipped(self) -> int:
        """Whole periods left out, between p2 and p_last (at least 1 in a cut ``layer_cut`` makes)."""
        return (self.end - self.first) // self.period - KEPT_BEFORE - 1

    @property
    def layers(self) -> tuple[int, ...]:
        """The trunk layers built, ascending."""
        n = self.period
        return (*range(self.first + KEPT_BEFORE * n), *range(self.first + (KEPT_BEFORE + self.skipped) * n,
                                                             self.n_layer))

    @property
    def checked(self) -> tuple[int, int, int, int]:
        """The first layers of p0, p1, p2 and p_last."""
        n = self.period
        return (self.first, self.first + n, self.first + 2 * n, self.first + (KEPT_BEFORE + self.skipped) * n)

    def times(self, m: int) -> LayerCut | None:
        """The cut of the same run with periods of ``m`` periods (where the allocator's state repeats over more
        layers than the model's period), or None where it leaves no period out."""
        cut = dataclasses.replace(self, period=self.period * m)
        return cut if cut.skipped >= 1 else None


def layer_signature(spec: ModelSpec, layout: CacheLayout, placement: Placement, il: int) -> tuple[Any, ...]:
    """What trunk layer ``il``'s graph and its place in the schedule depend on: the per-layer values the graph
    builders (planner.compute.graphs) read, its device and its cache's, and whether it is the first or last layer."""
    kv = layout.kv_by_layer.get(il)
    rescale = spec.rescale_every_n_layers
    experts = spec.expert_layers
    return (
        il == 0, il == layout.n_layer - 1,
        il in layout.recurrent_layers, kv and (kv.n_embd_k_gqa, kv.n_embd_v_gqa, kv.is_swa),
        layout.head_dim_k[il] if il < len(layout.head_dim_k) else None,
        layout.head_dim_v[il] if il < len(layout.head_dim_v) else None,
        spec.head_count(il), spec.head_count_kv(il), spec.feed_forward(il),
        experts[il] if experts is not None and il < len(experts) else None,
        il < spec.leading_dense_block_count,
        bool(rescale) and (il + 1) % rescale == 0,
        placement.layer_device(il), placement.cache_device(il),
    )


def layer_cut(signatures: Sequence[Any]) -> LayerCut | None:
    """The cut that leaves out most layers (``signatures``: each trunk layer's, ``layer_signature``), or None
    where no run repeats for KEPT_BEFORE + 2 periods."""
    n_layer = len(signatures)
    best: LayerCut | None = None
    for n in range(1, MAX_PERIOD + 1):
        i = n
        while i < n_layer:
            if signatures[i] != signatures[i - n]:
                i += 1
                continue
            start = i - n  # layers start .. i - 1 repeat with period n
            while i < n_layer and signatures[i] == signatures[i - n]:
                i += 1
            cut = LayerCut(start, i, n, n_layer)
            if cut.skipped >= 1 and (best is None or cut.skipped * n > best.skipped * best.period):
                best = cut
    return best


def model_cut(spec: ModelSpec, layout: CacheLayout, placement: Placement) -> LayerCut | None:
    """``layer_cut`` of the model's trunk layers under ``placement`` (None where ENABLED is off)."""
    if not ENABLED:
        return None
    return layer_cut([layer_signature(spec, layout, placement, il) for il in range(layout.n_layer)])


def layer_marks(nodes: Sequence[Any], layers: Sequence[int]) -> list[int] | None:
    """The index in ``nodes`` (a graph's) of each of ``layers``' first ``norm`` node (build_norm's, which every
    layer starts with), or None where one has none: twin layers' ranges between their marks are twins."""
    wanted = set(layers)
    found: dict[int, int] = {}
    for i, node in enumerate(nodes):
        layer = node.layer
        if node.name == "norm" and layer in wanted and layer not in found:
            found[layer] = i
    if len(found) != len(wanted):
        return None
    return [found[il] for il in layers]


@dataclass(frozen=True)
class GraphPeriods:
    """Where a cut graph's checked periods start: ``marks``, the node indices of p0, p1, p2 and p_last's first
    layers (``layer_marks``), and ``skipped``, the periods left out between p2 and p_last (``LayerCut``)."""

    marks: tuple[int, int, int, int]
    skipped: int

    @classmethod
    def of(cls, nodes: Sequence[Any], cut: LayerCut) -> GraphPeriods | None:
        """The periods of a graph built over ``cut.layers``, or None where its layers have no marks or its
        periods differ in node count (not twins)."""
        marks = layer_marks(nodes, cut.checked)
        if marks is None:
            return None
        m0, m1, m2, m3 = marks
        if not m1 - m0 == m2 - m1 == m3 - m2 > 0:
            return None
        return cls((m0, m1, m2, m3), cut.skipped)
