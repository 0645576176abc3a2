"""The model's weights of each repeating layer by name and shape, for the ``-ot`` patterns that decide where a graph
weight lives and for the types a device refuses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rsplan.hparams.ggml_types import weight_type as weight_type_of
from rsplan.planner.weights.weight_placement import BLOCK_NAME


@dataclass(frozen=True, eq=False)
class LayerTensors:
    """The model's loaded weights of each repeating layer with their shapes: the GGUF names a graph weight of that
    layer may be, for the ``-ot`` patterns that decide its buffer (the graph builders name only some of their
    weights). Compared and hashed by identity: one per model.

    Attributes:
        by_layer: layer -> its tensors' (name, ne padded to 4 dims).
        types: every loaded tensor's ggml type name (``q4_K``) by GGUF name; empty where unknown.
    """

    by_layer: Mapping[int, tuple[tuple[str, tuple[int, ...]], ...]]
    types: Mapping[str, str] = field(default_factory=dict)
    _names: dict[tuple[int, str, tuple[int, ...]], tuple[str, ...]] = field(default_factory=dict, repr=False)
    _refused: dict[Callable[[str, int, bool], bool], frozenset[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, Sequence[int]]], types: Mapping[str, str] | None = None) -> LayerTensors:
        """From (GGUF name, shape ne) pairs (tensors outside ``blk.N.`` are left out of ``by_layer``) and each
        loaded tensor's ggml type name by GGUF name (``types``: the size of a weight's copy in a compute buffer)."""
        by: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        for name, shape in tensors:
            m = BLOCK_NAME.match(name)
            if m:
                by.setdefault(int(m.group(1)), []).append((name, tuple((*shape, 1, 1, 1, 1)[:4])))
        return cls({k: tuple(v) for k, v in by.items()}, dict(types or {}))

    def refused_types(self, takes_weight: Callable[[str, int, bool], bool]) -> frozenset[str]:
        """The tensors' types (by their ggml names, ``q4_K``) that a device's matrix product does not take
        (``takes_weight``: DeviceKind's)."""
        hit = self._refused.get(takes_weight)
        if hit is None:
            known = {t for name in set(self.types.values()) if (t := weight_type_of(name)) is not None}
            hit = self._refused[takes_weight] = frozenset(t.name for t in known if not takes_weight(t.name, 0, False))
        return hit

    def names(self, layer: int, kind: str, ne: tuple[int, ...]) -> tuple[str, ...]:
        """The names a weight of ``layer`` with shape ``ne`` may have: of ``kind`` (the name after ``blk.N.``
        without its suffix, e.g. ``ssm_in`` or ``shortconv.in_proj``), those of that shape, else any of that kind
        (the graph may view a tensor otherwise than the file shapes it); no kind: any of that shape."""
        key = (layer, kind, ne)
        hit = self._names.get(key)
        if hit is None:
            hit = self._names[key] = self._find(layer, kind, ne)
        return hit

    def _find(self, layer: int, kind: str, ne: tuple[int, ...]) -> tuple[str, ...]:
        entries = self.by_layer.get(layer, ())
        if not kind:
            return tuple(n for n, s in entries if s == ne)
        named = [(n, s) for n, s in entries if (rest := n.split(".", 2)[2]) == kind or rest.startswith(kind + ".")]
        return tuple(n for n, s in named if s == ne) or tuple(n for n, _ in named)
