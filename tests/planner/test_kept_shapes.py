"""planner.compute.reuse.kept_shapes.ShapeCache: which query builds, reuses or sizes the ordinary way (fake sizings)."""

from __future__ import annotations

import dataclasses

import pytest

from rsplan.errors import RsplanError
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute.reuse.kept_shapes import ShapeCache, cells_apart
from rsplan.planner.compute.reuse.kv_affine import Affine, NotAffine


@pytest.fixture(scope="module")
def layout():
    return cache_layout(load_builtin_preset("lfm2-1.2b"))


def ctx_of(layout, n_ctx: int):
    return resolve_context(layout, ContextParams(n_ctx=n_ctx, n_seq_max=1))


class Recorder:
    """A fake sizing: ``build`` keeps the symbolic cells per stream (256 k) and narrows k to [lo, hi] by
    comparing it; a sizing is ('kept', cells at k) or ('ordinary', cells)."""

    def __init__(self, lo_cells: int = 0, raises: Exception | None = None) -> None:
        self.lo_cells, self.raises, self.builds = lo_cells, raises, 0

    def build(self, sym, cells):
        self.builds += 1
        if self.raises is not None:
            _ = sym.n_ctx_seq >= self.lo_cells  # the raise is decided on the cells too
            raise self.raises
        assert type(sym.n_ctx_seq) is Affine
        _ = sym.n_ctx_seq >= self.lo_cells  # a decision: holds from lo_cells on
        return sym.n_ctx_seq

    @staticmethod
    def size_at(kept, k):
        return ("kept", kept.at(k))

    def sized(self, cache, layout, n_ctx, key=("key",), holds=()):
        ctx = ctx_of(layout, n_ctx)
        return cache.sized(key, holds, ctx, self.build, self.size_at, lambda: ("ordinary", ctx.n_ctx_seq))


def test_a_key_is_kept_from_its_nth_query_and_reused_inside_its_interval(layout):
    cache, rec = ShapeCache(4, keep_from=2), Recorder(lo_cells=8192)
    assert rec.sized(cache, layout, 4096) == ("ordinary", 4096)  # first query: ordinary
    assert rec.sized(cache, layout, 16384) == ("kept", 16384)  # second: built at k = 64, kept for k >= 32
    assert rec.sized(cache, layout, 65536) == ("kept", 65536)  # inside: reused
    assert rec.sized(cache, layout, 4096) == ("kept", 4096)  # outside (k = 16 < 32): built again, for k < 32
    assert cache.stats == {"built": 2, "reused": 1, "raised": 0, "ordinary": 1}
    assert rec.sized(cache, layout, 6144) == ("kept", 6144)
    assert cache.stats["reused"] == 2


def test_a_caller_may_keep_from_a_later_query_than_the_cache_does(layout):
    """rsplan fit asks each placement about once: keep_from=2 on a keep_from=1 cache sizes a key's first query
    the ordinary way (no graphs built for it alone) and keeps from its second; other callers keep the cache's."""
    cache, rec = ShapeCache(4, keep_from=1), Recorder()

    def sized(n_ctx, key, keep_from=None):
        ctx = ctx_of(layout, n_ctx)
        return cache.sized(key, (), ctx, rec.build, rec.size_at, lambda: ("ordinary", ctx.n_ctx_seq), keep_from)

    assert sized(4096, ("fit",), keep_from=2) == ("ordinary", 4096)
    assert rec.builds == 0
    assert sized(8192, ("fit",), keep_from=2) == ("kept", 8192)
    assert sized(4096, ("capacity",)) == ("kept", 4096)
    assert rec.builds == 2
    assert cache.stats == {"built": 2, "reused": 0, "raised": 0, "ordinary": 1}


def test_a_context_that_is_not_whole_cells_is_sized_the_ordinary_way(layout):
    cache, rec = ShapeCache(4, keep_from=1), Recorder()
    ctx = dataclasses.replace(ctx_of(layout, 4096), n_ctx_seq=4000)  # not a multiple of 256
    got = cache.sized(("key",), (), ctx, rec.build, rec.size_at, lambda: "ordinary")
    assert got == "ordinary" and rec.builds == 0


def test_a_build_not_affine_is_not_tried_again_and_an_error_is_left_to_the_ordinary_sizing(layout):
    cache, rec = ShapeCache(4, keep_from=1), Recorder(raises=NotAffine("x"))
    assert [rec.sized(cache, layout, c)[0] for c in (4096, 8192)] == ["ordinary", "ordinary"]
    assert rec.builds == 1
    cache, rec = ShapeCache(4, keep_from=1), Recorder(raises=RsplanError("llama.cpp aborts"))
    assert [rec.sized(cache, layout, c)[0] for c in (4096, 8192)] == ["ordinary", "ordinary"]
    # an abort (kimi-linear's one-sequence reserve over several streams) would be built twice at every context,
    # once here and once by the ordinary sizing that reports it: the key goes the ordinary way from then on
    assert rec.builds == 1


class Abort(RsplanError):
    pass


def test_a_kept_error_holds_over_its_interval_and_is_raised_again_without_building(layout):
    cache, rec = ShapeCache(4, keep_from=1, kept_errors=(Abort,)), Recorder(lo_cells=8192, raises=Abort("aborts"))
    for n_ctx in (16384, 65536, 8192):  # built at k = 64: the raise holds for k >= 32
        with pytest.raises(Abort, match="aborts"):
            rec.sized(cache, layout, n_ctx)
    assert (rec.builds, cache.stats["raised"]) == (1, 2)
    with pytest.raises(Abort):  # k = 16, outside: built again (its interval is k < 32)
        rec.sized(cache, layout, 4096)
    assert (rec.builds, cache.stats) == (2, {"built": 0, "reused": 0, "raised": 2, "ordinary": 0})
    # an error not in kept_errors still sends the key the ordinary way
    cache, rec = ShapeCache(4, keep_from=1, kept_errors=(Abort,)), Recorder(raises=RsplanError("other"))
    assert [rec.sized(cache, layout, c)[0] for c in (4096, 8192)] == ["ordinary", "ordinary"]


def test_an_affine_size_refuses_to_be_printed():
    from rsplan.planner.compute.reuse.kv_affine import KCells

    a = Affine(0, 256, KCells(4))
    for show in (str, lambda x: f"{x}", lambda x: f"{x:,}", "{}".format):
        with pytest.raises(NotAffine):
            show(a)
    assert repr(a) == "0 + 256*k"


def test_an_entry_made_for_other_objects_with_the_same_ids_is_dropped(layout):
    cache, rec = ShapeCache(4, keep_from=1), Recorder()
    a, b = object(), object()
    rec.sized(cache, layout, 4096, holds=(a,))
    rec.sized(cache, layout, 8192, holds=(b,))  # same key, other object: built again
    assert cache.stats == {"built": 2, "reused": 0, "raised": 0, "ordinary": 0}


def test_the_least_recently_used_key_is_dropped(layout):
    cache, rec = ShapeCache(2, keep_from=1), Recorder()
    for key in ("a", "b", "a", "c"):
        rec.sized(cache, layout, 4096, key=(key,))
    rec.sized(cache, layout, 8192, key=("a",))  # kept: "b" was dropped, not "a"
    rec.sized(cache, layout, 8192, key=("b",))
    assert cache.stats == {"built": 4, "reused": 2, "raised": 0, "ordinary": 0}


def test_keys_without_graphs_do_not_push_out_the_ones_with_graphs(layout):
    cache, kept, aborts = ShapeCache(1, keep_from=1), Recorder(), Recorder(raises=RsplanError("llama.cpp aborts"))
    kept.sized(cache, layout, 4096, key=("np 8",))
    for np in range(9, 15):  # a search tries more sequences first; each aborts and keeps nothing
        assert aborts.sized(cache, layout, 8192, key=(f"np {np}",))[0] == "ordinary"
    assert kept.sized(cache, layout, 8192, key=("np 8",)) == ("kept", 8192)
    assert (kept.builds, cache.stats["reused"]) == (1, 1)  # np 8's graphs were still there
    Recorder().sized(cache, layout, 4096, key=("np 7",))  # a second key with graphs: np 8's are dropped
    assert kept.sized(cache, layout, 16384, key=("np 8",)) == ("kept", 16384)
    assert (kept.builds, cache.stats["reused"]) == (2, 1)


def test_the_key_leaves_out_the_cells_and_n_batch_only(layout):
    small, large = ctx_of(layout, 1024), ctx_of(layout, 131072)
    assert (small.n_batch, large.n_batch) == (1024, 2048)
    assert cells_apart(small) == cells_apart(large)
    assert cells_apart(small) != cells_apart(dataclasses.replace(large, n_ubatch=256))
