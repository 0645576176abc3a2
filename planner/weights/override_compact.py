"""The short ``-ot`` text of a list of tensor overrides: the same placement in fewer characters.

llama.cpp's --fit (and llama-fit-params) writes one ``-ot`` entry per layer whose experts it leaves on the host
(``blk\\.21\\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU``, then layer 22's, ...): 28 layers make 1,500 characters. A
run of consecutive entries that differ only in the layer number and go to the same buffer is one entry whose layer
is an alternation (``blk\\.(2[1-9]|3[0-9]|4[0-8])\\.ffn_...=CPU``). llama.cpp tries the entries in order, the first
whose pattern ``std::regex_search``-es a tensor's name placing it (src/llama-model.cpp, the tensor-buffer overrides
loop); a merged run names the same tensors as its entries did (each entry's layer number is followed by ``\\.`` and
preceded by ``blk\\.``, so no number matches inside another), and entries of one run name disjoint layers, so no
order among them matters and the list keeps the place of the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rsplan.planner.weights.weight_placement import TensorOverride

#: An entry for one layer, as llama.cpp's --fit and --n-cpu-moe write it: ``blk\.N\.`` then the tensor's pattern.
_ONE_LAYER = re.compile(r"blk\\\.(0|[1-9][0-9]*)(\\\..*)", re.DOTALL)


def layer_alternation(layers: Sequence[int]) -> str:
    """A regex alternation matching exactly the decimal numbers in ``layers`` (each followed by a non-digit in the
    name): ``[21, ..., 48]`` -> ``2[1-9]|3[0-9]|4[0-8]``."""
    out: list[str] = []
    values = sorted(set(layers))
    i = 0
    while i < len(values):  # each run of consecutive numbers, a decade at a time
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        n, hi = values[i], values[j]
        while n <= hi:
            tens, unit = divmod(n, 10)
            prefix = str(tens) if tens else ""
            end = min(hi, tens * 10 + 9)
            last = end % 10
            out.append(f"{prefix}{unit}" if end == n else f"{prefix}[{unit}-{last}]" if (unit, last) != (0, 9)
                       else f"{prefix}[0-9]")
            n = end + 1
        i = j + 1
    return "|".join(out)


def compact_overrides(overrides: Sequence[TensorOverride]) -> tuple[TensorOverride, ...]:
    """``overrides`` with each run of consecutive one-layer entries of the same tensor pattern and buffer merged
    into one entry (module docstring); every other entry as it is, in its place."""
    out: list[TensorOverride] = []
    run: list[int] = []
    key: tuple[str, str | int] | None = None

    def flush() -> None:
        if key is not None:
            rest, buffer = key
            layers = run[0] if len(run) == 1 else f"({layer_alternation(run)})"
            out.append(TensorOverride(f"blk\\.{layers}{rest}", buffer))

    for o in overrides:
        m = _ONE_LAYER.fullmatch(o.pattern)
        layer_key = (m.group(2), o.buffer) if m else None
        if m and layer_key == key and int(m.group(1)) not in run:
            run.append(int(m.group(1)))
            continue
        flush()
        key, run = None, []
        if m and layer_key is not None:
            key, run = layer_key, [int(m.group(1))]
        else:
            out.append(o)
    flush()
    return tuple(out)
