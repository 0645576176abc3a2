"""The ftypes ``llama-quantize`` accepts, and how it reads the name given on its command line.

Rules of llama.cpp 0c1e57098:
- tools/quantize/quantize.cpp ``QUANT_OPTIONS`` and ``try_parse_ftype``: the names ``llama-quantize`` accepts
  (``FTYPES`` below, case-insensitive; a leading integer names an ftype by its enum value, as ``std::stoi`` reads it);
- src/llama-quant.cpp ``llama_ftype_get_default_type``: the default type of each ftype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsplan.errors import ContextError, printable


@dataclass(frozen=True)
class FType:
    """One ``llama_ftype`` as ``llama-quantize`` names it.

    Attributes:
        name: the name ``llama-quantize`` prints (its ``QUANT_OPTIONS`` entry; aliases resolve to their target).
        value: the ``llama_ftype`` enum value (include/llama.h).
        default_type: ``llama_ftype_get_default_type``: the ggml type of every quantizable tensor before the
            mixture rules.
    """

    name: str
    value: int
    default_type: str


def _ft(name: str, value: int, default_type: str) -> FType:
    return FType(name, value, default_type)


#: tools/quantize/quantize.cpp ``QUANT_OPTIONS``, in its order (the order ``try_parse_ftype`` searches).
#: Aliases (``Q3_K``, ``Q4_K``, ``Q5_K``) map to another ftype; ``COPY`` copies every tensor unchanged.
FTYPES: tuple[FType, ...] = (
    _ft("Q1_0", 40, "q1_0"),
    _ft("Q2_0", 41, "q2_0"),
    _ft("Q4_0", 2, "q4_0"),
    _ft("Q4_1", 3, "q4_1"),
    _ft("MXFP4_MOE", 38, "mxfp4"),
    _ft("Q5_0", 8, "q5_0"),
    _ft("Q5_1", 9, "q5_1"),
    _ft("IQ2_XXS", 19, "iq2_xxs"),
    _ft("IQ2_XS", 20, "iq2_xs"),
    _ft("IQ2_S", 28, "iq2_xs"),
    _ft("IQ2_M", 29, "iq2_s"),
    _ft("IQ1_S", 24, "iq1_s"),
    _ft("IQ1_M", 31, "iq1_m"),
    _ft("TQ1_0", 36, "tq1_0"),
    _ft("TQ2_0", 37, "tq2_0"),
    _ft("Q2_K", 10, "q2_K"),
    _ft("Q2_K_S", 21, "q2_K"),
    _ft("IQ3_XXS", 23, "iq3_xxs"),
    _ft("IQ3_S", 26, "iq3_s"),
    _ft("IQ3_M", 27, "iq3_s"),
    _ft("Q3_K", 12, "q3_K"),  # alias for Q3_K_M
    _ft("IQ3_XS", 22, "iq3_s"),
    _ft("Q3_K_S", 11, "q3_K"),
    _ft("Q3_K_M", 12, "q3_K"),
    _ft("Q3_K_L", 13, "q3_K"),
    _ft("IQ4_NL", 25, "iq4_nl"),
    _ft("IQ4_XS", 30, "iq4_xs"),
    _ft("Q4_K", 15, "q4_K"),  # alias for Q4_K_M
    _ft("Q4_K_S", 14, "q4_K"),
    _ft("Q4_K_M", 15, "q4_K"),
    _ft("Q5_K", 17, "q5_K"),  # alias for Q5_K_M
    _ft("Q5_K_S", 16, "q5_K"),
    _ft("Q5_K_M", 17, "q5_K"),
    _ft("Q6_K", 18, "q6_K"),
    _ft("Q8_0", 7, "q8_0"),
    _ft("F16", 1, "f16"),
    _ft("BF16", 32, "bf16"),
    _ft("F32", 0, "f32"),
    _ft("COPY", 0, "f32"),  # only copy tensors, no quantizing
)

#: The names ``--quant`` accepts, in ``llama-quantize``'s order.
FTYPE_NAMES: tuple[str, ...] = tuple(f.name for f in FTYPES)

#: Aliases resolve to the ftype ``llama-quantize`` then names (``Q4_K`` quantizes as ``Q4_K_M``).
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def parse_ftype(text: str) -> FType:
    """The ftype ``llama-quantize`` reads from ``text`` (tools/quantize/quantize.cpp ``try_parse_ftype``).

    Names compare case-insensitively; otherwise a leading integer (``std::stoi``: optional spaces and sign, then
    digits, trailing text ignored) names the first ``QUANT_OPTIONS`` entry with that enum value.

    Raises:
        ContextError: neither a name nor a known value; the message lists the valid names.
    """
    upper = "".join(c.upper() if c.isascii() else c for c in text)  # std::toupper: ASCII letters only
    for ft in FTYPES:
        if ft.name == upper:
            return resolve_alias(ft)
    # ASCII digits only (std::stoi reads no others); past 10 digits the value is outside int32 (std::out_of_range)
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", text, re.ASCII)
    if m and len(m.group(1).lstrip("+-")) <= 10 and -(1 << 31) <= int(m.group(1)) < (1 << 31):
        for ft in FTYPES:
            if ft.value == int(m.group(1)):
                return resolve_alias(ft)
    shown = printable(text if len(text) <= 40 else text[:37] + "...")
    raise ContextError(f"unknown --quant '{shown}' (llama-quantize accepts: {', '.join(FTYPE_NAMES)})")


def resolve_alias(ft: FType) -> FType:
    """The ftype ``llama-quantize`` quantizes as for ``ft``: an alias (``Q4_K``) resolves to its target (``Q4_K_M``)."""
    alias = _ALIASES.get(ft.name)
    return next(f for f in FTYPES if f.name == alias) if alias else ft
