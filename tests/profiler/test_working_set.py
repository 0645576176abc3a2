"""What a profile measures: the regime of a working set against the cache levels, the -np a run picks when none
is given (and why it stops short), the first line that says so, the like-for-like baselines and the row flags.
Plain arithmetic on made-up sizes and fake timings: no torch, no profile run."""

from __future__ import annotations

import math

import pytest

from rsplan.profiler.working_set import (
    DECODE_TIME_SHARE,
    ParallelChoice,
    choice_line,
    given_parallel,
    no_decode,
    pick_parallel,
    regime,
    working_set_bytes,
)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: The cache levels of the 2-core EPYC VM the profiler ran on (sysfs: L1d 32K, L2 1024K, L3 32768K).
CACHES = {1: 32 * KIB, 2: 1 * MIB, 3: 32 * MIB}


@pytest.mark.parametrize(
    ("ws", "expected"),
    [
        (16 * KIB, "L1"),
        (32 * KIB, "L1"),  # fits exactly
        (32 * KIB + 1, "L2"),
        (1 * MIB + 1, "L3"),
        (32 * MIB, "L3"),
        (32 * MIB + 1, "LLC-DRAM"),  # over the last level, under 4x it: partly cached
        (128 * MIB - 1, "LLC-DRAM"),
        (128 * MIB, "DRAM"),  # 4 x 32 MiB
    ],
    ids=lambda v: str(v),
)
def test_regime_is_the_smallest_level_that_holds_the_working_set(ws, expected):
    assert regime(ws, CACHES) == expected


def test_regime_without_cache_sizes_is_unknown():
    assert regime(1, {}) == "unknown"


def test_the_working_set_is_half_the_bytes_moved():
    assert working_set_bytes(264 * MIB + 1) == 132 * MIB


def _pick(**kw):
    base = {"ws_per_seq": 18 * MIB, "ws_fixed": 1 * MIB, "mem_per_seq": 18 * MIB, "mem_budget": 100 * GIB,
            "llc_bytes": 32 * MIB, "max_seq": 256, "rounds": 23, "max_seconds": 0.0}
    return pick_parallel(**{**base, **kw})


def test_the_fewest_sequences_that_reach_four_times_the_llc():
    # 4 x 32 MiB = 128 MiB: 7 sequences give 7 x 18 + 1 = 127 MiB (short by one), 8 give 145 MiB
    c = _pick()
    assert c == ParallelChoice(8, True, 145 * MIB, 128 * MIB)
    assert c.dram and c.limited_by is None


def test_a_480_mib_llc_asks_for_about_1_9_gib():
    # 4 x 480 MiB = 1920 MiB; mamba2-130m-like 18 MiB per sequence: ceil((1920 - 1) / 18) = 107 sequences
    c = _pick(llc_bytes=480 * MIB)
    assert c.n_seq_max == 107 and c.working_set_bytes == 107 * 18 * MIB + MIB >= 1920 * MIB


def test_llama_cpps_sequence_limit_stops_a_model_with_small_states():
    # 160 KiB per sequence (LFM2-like short-conv rows) would need ceil(128 MiB / 160 KiB) = 820 sequences
    c = _pick(ws_per_seq=160 * KIB, ws_fixed=0, mem_per_seq=160 * KIB)
    assert (c.n_seq_max, c.limited_by, c.dram) == (256, "-np limit", False)
    assert c.working_set_bytes == 256 * 160 * KIB == 40 * MIB
    assert c.detail == "llama.cpp allows at most -np 256"
    ub = _pick(ws_per_seq=160 * KIB, ws_fixed=0, max_seq=64, max_seq_why="the prefill ubatch -ub 64 ...")
    assert (ub.n_seq_max, ub.detail) == (64, "the prefill ubatch -ub 64 ...")


def test_a_small_host_measures_what_fits_and_says_memory():
    # 100 MiB for the pools at 18 MiB a sequence: 5 sequences (91 MiB of working set, 2.8x the L3)
    c = _pick(mem_budget=100 * MIB)
    assert (c.n_seq_max, c.limited_by, c.working_set_bytes) == (5, "memory", 91 * MIB)
    assert "0.10 GiB here, 18.00 MiB per sequence" in c.detail
    # no room even for one: one sequence all the same (the allocator then says what does not fit)
    assert _pick(mem_budget=MIB).n_seq_max == 1


def test_the_time_rule_lowers_the_sequences_at_the_slowest_bandwidth():
    # 23 rounds within 25% of 180 s: 1.9565 s a step; at 1.5 GB/s that moves 2.93 GB, i.e. a working set of
    # 1.467e9 B = 13.99 x 100 MiB: 13 sequences where 4 x 480 MiB wants 20
    step_s = DECODE_TIME_SHARE * 180 / 23
    expected = math.floor(step_s * 1.5e9 / 2 / (100 * MIB))
    assert expected == 13
    c = _pick(ws_per_seq=100 * MIB, ws_fixed=0, mem_per_seq=100 * MIB, llc_bytes=480 * MIB, max_seconds=180.0)
    assert (c.n_seq_max, c.limited_by) == (13, "time")
    assert _pick(ws_per_seq=100 * MIB, ws_fixed=0, llc_bytes=480 * MIB).n_seq_max == 20  # no limit: 0


def test_the_lowest_limit_is_the_one_named():
    c = _pick(ws_per_seq=160 * KIB, ws_fixed=0, mem_per_seq=160 * KIB, mem_budget=10 * MIB)  # 64 < 256
    assert (c.n_seq_max, c.limited_by) == (64, "memory")


def test_no_cache_size_means_one_sequence_and_says_why():
    c = _pick(llc_bytes=None)
    assert (c.n_seq_max, c.target_bytes, c.limited_by, c.dram) == (1, None, "cache size unknown", False)


def test_a_non_positive_sequence_size_is_a_bug():
    with pytest.raises(ValueError, match="ws_per_seq must be positive, got 0"):
        _pick(ws_per_seq=0)


def test_the_first_line_says_what_was_measured_and_why():
    llc = 32 * MIB
    assert choice_line(_pick(), llc, "L3 (sysfs)") == (
        "measured: DRAM bandwidth of the state path: decode at -np 8, working set 145.0 MiB = 4.5x the 32.0 MiB L3 "
        "(sysfs) (-np picked so that decode's working set is at least 4x the last-level cache)")
    limited = _pick(ws_per_seq=160 * KIB, ws_fixed=0, mem_per_seq=160 * KIB)
    assert choice_line(limited, llc, "L3 (sysfs)") == (
        "measured: decode at -np 256, working set 40.0 MiB = 1.2x the 32.0 MiB L3 (sysfs), short of 4x (-np limit: "
        "llama.cpp allows at most -np 256): partly cache-resident, not DRAM bandwidth")
    small = given_parallel(1, 18 * MIB, llc)
    assert not small.picked and not small.dram
    assert choice_line(small, llc, "L3 (sysfs)") == (
        "measured: cache-resident decode: -np 1 as given, working set 18.0 MiB = 0.6x the 32.0 MiB L3 (sysfs) "
        "(under 4x; leave -np out to measure DRAM)")
    assert choice_line(given_parallel(3, 54 * MIB, llc), llc, "L3").startswith("measured: partly cache-resident")
    assert choice_line(given_parallel(8, 145 * MIB, llc), llc, "L3").endswith("(-np as given)")
    assert choice_line(given_parallel(1, 600 * KIB, None), None, "").startswith(
        "measured: decode at -np 1 (working set 600.0 KiB); the regime is unknown")


def test_without_decode_nothing_is_sized():
    c = no_decode(600 * 1024, 32 * MIB, "prefill")
    assert (c.n_seq_max, c.limited_by, c.dram) == (1, "no decode", False)
    assert choice_line(c, 32 * MIB, "L3 (sysfs)") == (
        "measured: --workload prefill runs no decode: -np 1 (give -np to size the cells)")
