"""planner.compute.reuse.kv_affine: integers affine in k, and the interval of k over which each decision taken on them
holds."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsplan.planner.compute.reuse.kv_affine import Affine, KCells, NotAffine


def x_at(k: int, c0: int, c1: int) -> tuple[KCells, Affine]:
    cells = KCells(k)
    return cells, Affine(c0, c1, cells)


def test_arithmetic_stays_affine_and_collapses_to_an_int_without_k():
    cells, x = x_at(10, -25, 3)  # 3k - 25 = 5 at k = 10
    y = (x + 7) * 4 - 2  # 12k - 74
    assert (y.c0, y.c1, y.value) == (-74, 12, 46)
    assert (7 - x).c0 == 32 and (7 - x).c1 == -3
    assert (x * 2) // 6 == Affine(-9, 1, cells)  # (6k - 50) // 6 = k - 9 exactly (6 divides 6k)
    assert ((x * 2) // 6).value == 1  # floor(10 / 6) = 1 = 10 - 9
    assert x - x == 0 and type(x - x) is int
    assert (x * 4 + 3) % 4 == 3  # (12k - 97) % 4: 12k is a multiple of 4, -97 % 4 = 3
    assert (cells.lo, cells.hi) == (1, 1 << 40)  # arithmetic decides nothing


def test_an_order_comparison_holds_on_one_side_of_its_root():
    cells, x = x_at(10, -25, 3)  # 3k - 25: >= 0 from k = 9 (ceil(25/3))
    assert x >= 0
    assert (cells.lo, cells.hi) == (9, 1 << 40)
    assert not x > 5  # 3k - 25 > 5 <=> k > 10: false up to k = 10
    assert (cells.lo, cells.hi) == (9, 10)


def test_a_falling_value_narrows_from_the_other_side():
    cells, x = x_at(4, 100, -7)  # 100 - 7k = 72 at k = 4; >= 30 up to k = 10
    assert x >= 30
    assert (cells.lo, cells.hi) == (1, 10)
    assert x < 90  # 100 - 7k < 90 <=> k >= 2
    assert (cells.lo, cells.hi) == (2, 10)


def test_an_equality_holds_only_at_its_root_and_an_inequality_on_its_side():
    cells, x = x_at(10, -25, 3)
    assert x != 4  # 3k - 25 = 4 has no integer root; 5 > 4 from k = 10 on
    assert (cells.lo, cells.hi) == (10, 1 << 40)
    assert x == 5
    assert (cells.lo, cells.hi) == (10, 10)


def test_two_affine_values_compare_by_their_difference():
    cells = KCells(8)
    a, b = Affine(0, 4, cells), Affine(10, 3, cells)  # 4k vs 3k + 10: equal at k = 10
    assert a < b  # k < 10
    assert (cells.lo, cells.hi) == (1, 9)
    assert a == Affine(0, 4, cells)  # identical: true at every k, nothing narrowed
    assert (cells.lo, cells.hi) == (1, 9)


def test_a_size_is_true_where_it_is_not_zero():
    cells, x = x_at(3, -512, 256)  # zero at k = 2
    assert x
    assert (cells.lo, cells.hi) == (3, 1 << 40)


@pytest.mark.parametrize("what", [
    lambda x: x * x,
    lambda x: x // 3,  # 3 does not divide c1 = 256
    lambda x: 4096 // x,
    lambda x: int(x),
    lambda x: hash(x),
    lambda x: list(range(x)),
    lambda x: {x: 1},
])
def test_what_is_not_affine_in_k_raises(what):
    _, x = x_at(16, 0, 256)
    with pytest.raises(NotAffine):
        what(x)


OPS = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne]


@settings(max_examples=400, deadline=None)
@given(c0=st.integers(-10_000, 10_000), c1=st.integers(-300, 300).filter(bool), k=st.integers(1, 200),
       other=st.one_of(st.integers(-10_000, 10_000), st.tuples(st.integers(-10_000, 10_000), st.integers(-300, 300))),
       op=st.sampled_from(OPS), probes=st.lists(st.integers(1, 400), max_size=12))
def test_a_decision_taken_at_k_is_the_same_at_every_k_of_its_interval(c0, c1, k, other, op, probes):
    cells, x = x_at(k, c0, c1)
    y = other if isinstance(other, int) else Affine(other[0], other[1], cells) if other[1] else other[0]
    got = op(x, y)
    assert cells.lo <= k <= cells.hi

    def concrete(j: int) -> bool:
        yj = y if isinstance(y, int) else y.at(j)
        return op(x.at(j), yj)

    assert got == concrete(k)
    hi = min(cells.hi, 1000)
    for j in {cells.lo, hi, *(p for p in probes if cells.lo <= p <= hi)}:
        assert concrete(j) == got, (j, cells.lo, cells.hi)
    if op in (operator.eq, operator.ne) and not (got if op is operator.eq else not got):
        return  # "not equal" holds on both sides of a root: kept on k's side only (narrower than need be)
    # an order comparison or an equality that holds: the interval is as wide as it may be, so just outside it
    # the decision differs (or k is at its bound)
    if cells.lo > 1:
        assert concrete(cells.lo - 1) != got
    if cells.hi < 1000:
        assert concrete(cells.hi + 1) != got
