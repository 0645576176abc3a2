"""Byte counts for display (binary units, labelled as such), and size arguments with units."""

from __future__ import annotations

import re

from rsplan.errors import RsplanError

MIB = 1 << 20
GIB = 1 << 30

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1 << 10,
    "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
    "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
    "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
#: The largest size accepted, bytes (1 EiB: far beyond any memory, far below int overflow anywhere).
MAX_SIZE = 1 << 60
#: A count of tokens: digits, optionally ``k`` / ``K`` for thousands of 1024 (as people say "8k context").
_COUNT = re.compile(r"^\s*([0-9]{1,12})\s*([kK]?)\s*$", re.ASCII)
#: A size argument longer than this is not read at all (int() of thousands of digits is refused by Python).
_MAX_SIZE_CHARS = 64


def mib(n_bytes: int) -> str:
    """``n_bytes`` in MiB with two decimals (display only)."""
    return f"{n_bytes / MIB:,.2f}"


def human(n_bytes: int) -> str:
    """A short human label: ``768.00 MiB``, ``1.50 GiB``."""
    if abs(n_bytes) >= GIB:
        return f"{n_bytes / GIB:,.2f} GiB"
    return f"{n_bytes / MIB:,.2f} MiB"


def shown(text: str, limit: int = 40) -> str:
    """``text`` as echoed in an error message: at most ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_size(text: str, what: str = "size", *, allow_zero: bool = False, require_unit: bool = False) -> int:
    """Parse ``24GiB``, ``80G`` (decimal), ``81920MiB``, ``1024`` (bytes) into an exact number of bytes.

    ASCII digits only, at most MAX_SIZE bytes; zero only with ``allow_zero`` (a size that rounds down to zero
    bytes, like ``0.5``, is refused either way). With ``require_unit`` a number without a unit (other than 0) is
    refused: ``--budget 24`` means 24 GiB to a person and 24 bytes to a parser.
    """
    m = _SIZE.match(text) if len(text) <= _MAX_SIZE_CHARS else None
    if not m:
        raise RsplanError(f"{what}: cannot read '{shown(text)}' as a size (examples: 24GiB, 80GB, 81920MiB)")
    number, unit = m.groups()
    if require_unit and not unit and any(c in "123456789" for c in number):
        # suggest only the readings that are sizes rsplan takes
        fits = {u for u in ("GiB", "GB", "B") if _bytes(number, _UNITS[u.lower()]) <= MAX_SIZE}
        if not fits:
            raise RsplanError(f"{what}: '{shown(text.strip())}' has no unit and is absurdly large in any unit")
        units = [f"{number}{u}" for u in ("GiB", "GB") if u in fits]
        raise RsplanError(f"{what}: '{text.strip()}' has no unit; give one"
                          + (f", e.g. {' or '.join(units)}" if units else "")
                          + (f" (bytes: {number}B)" if "B" in fits else ""))
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise RsplanError(f"{what}: unknown unit '{unit}' in '{text}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    value = _bytes(number, factor)
    if value == 0 and any(c in "123456789" for c in number):
        raise RsplanError(f"{what}: '{text.strip()}' is less than one byte")
    if value == 0 and not allow_zero:
        raise RsplanError(f"{what}: must be positive, got '{text}'")
    if value > MAX_SIZE:
        raise RsplanError(f"{what}: '{shown(text)}' is absurdly large")
    return value


def read_count(text: str) -> int | None:
    """``32768`` or ``32k`` / ``32K`` (k = 1024) -> 32768, the way -c, -b, -ub and --ctx read a number of tokens
    (at most 12 digits; ranges are the caller's); None if ``text`` is not one."""
    m = _COUNT.match(text) if len(text) <= _MAX_SIZE_CHARS else None
    return int(m.group(1)) * (1024 if m.group(2) else 1) if m else None


def _bytes(number: str, factor: int) -> int:
    """``number`` (ASCII digits, at most one ``.``) times ``factor``, rounded down to whole bytes."""
    if "." in number:
        whole, frac = number.split(".")
        return int(whole) * factor + int(frac) * factor // 10 ** len(frac)
    return int(number) * factor
