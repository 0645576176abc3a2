"""Integers affine in a context's KV cells, with the interval over which every decision taken on them holds.

A reserve graph depends on the context size only through ``n_ctx_seq``, the KV cells of each stream (a multiple of
256: llama.cpp pads it, src/llama-context.cpp:295 cparams.n_ctx_seq): the KQ mask and the views of the caches are
that many cells wide. A graph built with ``n_ctx_seq = 256 * k`` for a symbolic ``k`` has shapes, strides and view
offsets ``c0 + c1 * k``; its nodes, their order, their backends and the scheduler's splits are those of every ``k``
for which the comparisons made while building and scheduling it come out the same.

``Affine`` is such an integer. It carries the value of ``k`` it was built at (``KCells.k``): each comparison
between affine values is decided at that ``k`` and narrows ``KCells.lo``/``KCells.hi`` to the integers ``k`` where
it comes out the same (an order comparison holds on one side of a root, an equality only at it). So the graph
built once is, with its shapes evaluated at any ``k`` in ``[lo, hi]``, the graph llama.cpp builds at that ``k``:
the same program run on different integers, taking the same branches. Arithmetic that is not affine in ``k`` (a
product of two affine values, a floor division that does not divide ``c1``, conversion to ``int``, hashing) and
printing (a message naming a size would be that k's only) raise ``NotAffine``: the caller sizes that setting the
ordinary way instead. Nothing is sampled or fitted.
"""

from __future__ import annotations

from typing import Any


class NotAffine(Exception):
    """An operation whose result is not affine in k (or not a number): size this setting concretely."""


class KCells:
    """The symbolic variable ``k`` (n_ctx_seq = 256 * k) of one sizing run: its value ``k`` and the interval
    ``[lo, hi]`` of values that take every decision made so far the same way."""

    def __init__(self, k: int, lo: int = 1, hi: int = 1 << 40) -> None:
        if not lo <= k <= hi:
            raise ValueError(f"k = {k} is outside [{lo}, {hi}]")
        self.k = k
        self.lo = lo
        self.hi = hi

    def at_least_zero(self, c0: int, c1: int) -> bool:
        """Whether ``c0 + c1 * k >= 0`` at ``self.k`` (c1 != 0); narrows [lo, hi] to the ``k`` where it is the same."""
        holds = c0 + c1 * self.k >= 0
        if c1 > 0:  # >= 0 exactly from k = ceil(-c0 / c1) on
            t = -(c0 // c1)
            if holds:
                self.lo = max(self.lo, t)
            else:
                self.hi = min(self.hi, t - 1)
        else:  # >= 0 exactly up to k = floor(c0 / -c1)
            t = c0 // -c1
            if holds:
                self.hi = min(self.hi, t)
            else:
                self.lo = max(self.lo, t + 1)
        return holds

    def is_zero(self, c0: int, c1: int) -> bool:
        """Whether ``c0 + c1 * k == 0`` at ``self.k`` (c1 != 0): where it is, only at that k; where it is not, over
        the side of its root that k is on."""
        v = c0 + c1 * self.k
        if v == 0:
            self.lo = self.hi = self.k
            return True
        if v > 0:
            self.at_least_zero(c0 - 1, c1)  # v >= 1
        else:
            self.at_least_zero(-c0 - 1, -c1)  # -v >= 1
        return False


class Affine:
    """The integer ``c0 + c1 * k`` (``c1 != 0``; an affine value with ``c1 == 0`` is returned as a plain int).

    Supports +, -, * and // by ints (// only where it is exact for every integer k: ``c1`` divisible by the
    divisor), % by an int that divides ``c1``, and comparisons with ints and other affine values (each narrows the
    run's KCells). Anything else raises NotAffine.
    """

    __slots__ = ("c0", "c1", "cells")

    def __init__(self, c0: int, c1: int, cells: KCells) -> None:
        self.c0 = c0
        self.c1 = c1
        self.cells = cells

    @property
    def value(self) -> int:
        """The integer at the run's k."""
        return self.c0 + self.c1 * self.cells.k

    def at(self, k: int) -> int:
        """The integer at another ``k`` (exact where ``k`` lies in the run's [lo, hi])."""
        return self.c0 + self.c1 * k

    def _make(self, c0: int, c1: int) -> Any:
        return Affine(c0, c1, self.cells) if c1 else c0

    # -- arithmetic ------------------------------------------------------------------------------------------------

    def __add__(self, o: Any) -> Any:
        if type(o) is int:
            return Affine(self.c0 + o, self.c1, self.cells)
        if type(o) is Affine:
            return self._make(self.c0 + o.c0, self.c1 + o.c1)
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, o: Any) -> Any:
        if type(o) is int:
            return Affine(self.c0 - o, self.c1, self.cells)
        if type(o) is Affine:
            return self._make(self.c0 - o.c0, self.c1 - o.c1)
        return NotImplemented

    def __rsub__(self, o: Any) -> Any:
        if type(o) is int:
            return Affine(o - self.c0, -self.c1, self.cells)
        return NotImplemented

    def __neg__(self) -> Affine:
        return Affine(-self.c0, -self.c1, self.cells)

    def __mul__(self, o: Any) -> Any:
        if type(o) is int:
            return self._make(self.c0 * o, self.c1 * o)
        if type(o) is Affine:
            raise NotAffine("product of two sizes that both grow with the KV cells")
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, o: Any) -> Any:
        if type(o) is int and o > 0 and self.c1 % o == 0:
            return self._make(self.c0 // o, self.c1 // o)
        if type(o) is Affine and o.c0 == self.c0 and o.c1 == self.c1:
            return 1
        raise NotAffine(f"({self!r}) // {o!r} is not affine in the KV cells")

    def __rfloordiv__(self, o: Any) -> Any:
        raise NotAffine(f"{o!r} // ({self!r}) is not affine in the KV cells")

    def __mod__(self, o: Any) -> Any:
        if type(o) is int and o > 0 and self.c1 % o == 0:
            return self.c0 % o
        if type(o) is Affine and o.c0 == self.c0 and o.c1 == self.c1:
            return 0
        raise NotAffine(f"({self!r}) % {o!r} is not affine in the KV cells")

    def __rmod__(self, o: Any) -> Any:
        raise NotAffine(f"{o!r} % ({self!r}) is not affine in the KV cells")

    # -- decisions -------------------------------------------------------------------------------------------------

    def _minus(self, o: Any) -> tuple[int, int] | None:
        """``self - o`` as (c0, c1); None when ``o`` is not an integer."""
        if type(o) is Affine:
            return self.c0 - o.c0, self.c1 - o.c1
        if type(o) is int or type(o) is bool:
            return self.c0 - o, self.c1
        return None

    def _ge(self, d: tuple[int, int] | None, offset: int) -> Any:
        """Whether ``d + offset >= 0`` (a decision narrowing the interval)."""
        if d is None:
            return NotImplemented
        d0, d1 = d[0] + offset, d[1]
        return d0 >= 0 if d1 == 0 else self.cells.at_least_zero(d0, d1)

    def __ge__(self, o: Any) -> Any:
        return self._ge(self._minus(o), 0)

    def __gt__(self, o: Any) -> Any:
        return self._ge(self._minus(o), -1)  # integers: a - b > 0 <=> a - b - 1 >= 0

    def __le__(self, o: Any) -> Any:
        d = self._minus(o)
        return self._ge(None if d is None else (-d[0], -d[1]), 0)

    def __lt__(self, o: Any) -> Any:
        d = self._minus(o)
        return self._ge(None if d is None else (-d[0], -d[1]), -1)

    def __eq__(self, o: Any) -> Any:
        d = self._minus(o)
        if d is None:
            return NotImplemented
        return d[0] == 0 if d[1] == 0 else self.cells.is_zero(d[0], d[1])

    def __ne__(self, o: Any) -> Any:
        eq = self.__eq__(o)
        return eq if eq is NotImplemented else not eq

    def __bool__(self) -> bool:
        return not self.cells.is_zero(self.c0, self.c1)

    # -- what an affine value cannot be ----------------------------------------------------------------------------

    def __hash__(self) -> int:
        raise NotAffine("an affine size used as a key")

    def __index__(self) -> int:
        raise NotAffine("an affine size used as an index or a count")

    def __int__(self) -> int:
        raise NotAffine("an affine size converted to int")

    def __float__(self) -> float:
        raise NotAffine("an affine size converted to float")

    def __str__(self) -> str:
        raise NotAffine("an affine size printed")

    def __format__(self, spec: str) -> str:
        raise NotAffine("an affine size printed")

    def __repr__(self) -> str:
        return f"{self.c0} + {self.c1}*k"

