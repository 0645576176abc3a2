"""llama.cpp's flags read as llama.cpp (0c1e57098, common/arg.cpp) reads them, at the edges: ``-ngl`` (negative,
``auto``, std::stoi's leniency and range), ``-ot`` (empty entries, repeated flags, groups std::regex refuses),
``-ts`` (std::stof's range, the trailing comma, all-zero parts under --fit) and ``--quant`` numbers. What llama.cpp
accepts is accepted with its meaning (the same answer as the plain spelling); what it refuses is one ``Error:`` line.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import one_line_error

#: --fit has to move layers here (lfm2-8b-a1b Q4_K_M is ~4.7 GiB), so a user -ngl stops it
FIT_TIGHT = ("fit", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "2GiB", "--host-budget", "64GiB")
FIT_ROOMY = ("fit", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "--host-budget", "64GiB")
FIT_TWO = ("fit", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "1GiB,1GiB", "--host-budget", "64GiB")
CAPACITY = ("capacity", "-m", "lfm2-1.2b", "--budget", "8GiB", "--ctx", "4k", "--host-budget", "64GiB")


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def answer(*args: str) -> dict:
    r = run(*args, "--format", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# -- -ngl ------------------------------------------------------------------------------------------------------------
# common/arg.cpp:2791-2798: "auto" -1, "all" -2, else std::stoi; common/common.h:475 "-1 is auto, <= -2 is all";
# src/llama-model.cpp:2002-2004 offloads every layer for any negative value; common/fit.cpp:463-464 moves layers
# only while n_gpu_layers is the default -1.

@pytest.mark.parametrize("ngl", ["-1", "auto"])
def test_fit_reads_minus_one_as_auto_and_still_moves_layers(ngl):
    auto = answer(*FIT_TIGHT)
    assert auto["changed"] and auto["n_gpu_layers"] == 25  # the search ran: layers stayed, experts went to the host
    assert answer(*FIT_TIGHT, "-ngl", ngl) == auto


@pytest.mark.parametrize(("ngl", "shown"), [("-5", "-5"), ("-2", "-2"), ("all", "-2"), ("+3", "3"), (" 3", "3"),
                                            ("3x", "3"), ("99", "99")])
def test_fit_stops_at_any_other_user_ngl_as_llamacpp(ngl, shown):
    # 1 GiB, less the 1 GiB margin --fit keeps free: too little even for 3 layers' weights (559 MiB), so --fit
    # must act, and a user's -ngl stops it (at 2 GiB, -ngl 3 fits once the context is lowered)
    r = run(*FIT_TIGHT[:5], "--budget", "1GiB", *FIT_TIGHT[7:], "-ngl", ngl)
    assert r.exit_code == 1, r.output  # as llama-fit-params's when --fit gives up
    assert f"--fit gives up: n_gpu_layers already set by user to {shown}, abort" in r.output


@pytest.mark.parametrize("ngl", ["-5", "-2", "all", "99", "2147483647"])
def test_fit_places_every_unit_for_negative_and_too_large_values(ngl):
    # src/llama-model.cpp:1589-1590: i_gpu_start = max(n_units - ngl, 0), act_gpu_layers = min(ngl, n_units); the
    # memory is that of -ngl 25 (24 layers + output), only the flags echo what was given
    def memory(result: dict) -> tuple:
        return result["devices"], result["host"]

    assert memory(answer(*FIT_ROOMY, "-ngl", ngl)) == memory(answer(*FIT_ROOMY, "-ngl", "25"))
    assert memory(answer(*FIT_ROOMY, "-ngl", "24")) != memory(answer(*FIT_ROOMY, "-ngl", "25"))


@pytest.mark.parametrize("ngl", ["-1", "auto", "-2", "-5", "-2147483648"])
def test_capacity_places_every_layer_for_auto_and_negative_values(ngl):
    assert answer(*CAPACITY, "-ngl", ngl) == answer(*CAPACITY) == answer(*CAPACITY, "-ngl", "all")


@pytest.mark.parametrize("ngl", ["+3", " 3", "3x", "3 layers"])
def test_capacity_reads_ngl_as_stoi_does(ngl):
    assert answer(*CAPACITY, "-ngl", ngl) == answer(*CAPACITY, "-ngl", "3")


@pytest.mark.parametrize(("command", "ngl", "message"), [
    (FIT_ROOMY, "2147483648", "-ngl 2147483648: out of range (llama.cpp reads an int32; for every layer: -ngl all)"),
    (CAPACITY, "-2147483649",
     "-ngl -2147483649: out of range (llama.cpp reads an int32; for every layer: -ngl all)"),
    (FIT_ROOMY, "ALL", "-ngl: cannot read 'ALL' as a number of layers, auto or all"),
    (CAPACITY, "Auto", "-ngl: cannot read 'Auto' as a number of layers, auto or all"),
    (CAPACITY, " all", "-ngl: cannot read ' all' as a number of layers, auto or all"),
    (CAPACITY, "\u0663", "-ngl: cannot read '\u0663' as a number of layers, auto or all"),
    (FIT_ROOMY, "", "-ngl: cannot read '' as a number of layers, auto or all"),
], ids=["past int32", "below int32", "ALL", "Auto", "space all", "Arabic-Indic 3", "empty"])
def test_ngl_llamacpp_refuses(command, ngl, message):
    assert one_line_error(run(*command, "-ngl", ngl)) == message


# -- -ot -------------------------------------------------------------------------------------------------------------
# common/arg.cpp:252-283: string_split (common/common.h:822) keeps empty parts; an entry without '=' is refused
# ("invalid value"), an unknown buffer type too; the pattern may be empty. Each -ot appends (arg.cpp:2756).

@pytest.mark.parametrize("ot", ["a=CPU,", ",a=CPU", "a=CPU,,b=CPU", ""])
def test_an_empty_override_entry_is_refused_as_llamacpp_does(ot):
    assert one_line_error(run(*FIT_ROOMY, "-ot", ot)) == (
        f"-ot '{ot}': an empty entry; llama.cpp refuses it (each comma-separated entry is PATTERN=BUFFER_TYPE)"
    )


def test_an_empty_buffer_type_is_unknown():
    assert one_line_error(run(*FIT_ROOMY, "-ot", "a=")) == "-ot 'a=': unknown buffer type '' (have: CPU, CUDA0)"


def test_an_empty_pattern_matches_every_tensor():
    every = answer(*FIT_ROOMY, "-ot", ".=CPU")
    assert answer(*FIT_ROOMY, "-ot", "=CPU")["devices"] == every["devices"]
    assert every["devices"] != answer(*FIT_ROOMY)["devices"]


def test_repeated_override_flags_add_up():
    one = answer(*FIT_ROOMY, "-ot", r"blk\.10\.=CPU,blk\.20\.=CPU")
    two = answer(*FIT_ROOMY, "-ot", r"blk\.10\.=CPU", "-ot", r"blk\.20\.=CPU")
    assert two == one
    assert two["devices"] != answer(*FIT_ROOMY, "-ot", r"blk\.20\.=CPU")["devices"]


@pytest.mark.parametrize(("pattern", "group"), [
    ("blk(?P<n>1)", "(?P<"), ("(?i)BLK", "(?i)"), ("blk(?#note)", "(?#n"), ("(?>blk)", "(?>b"),
], ids=["named group", "inline flag", "comment", "atomic group"])
def test_groups_stdregex_refuses_are_refused(pattern, group):
    # std::regex (ECMAScript, libstdc++) throws "Invalid '(?...)' zero-width assertion" for each: the loader fails
    assert one_line_error(run(*FIT_ROOMY, "-ot", f"{pattern}=CPU")) == (
        f"-ot '{pattern}=CPU': '{group}...' is not a group llama.cpp's std::regex (ECMAScript) reads (only (?:, (?= "
        "and (?!); llama.cpp would fail to load the model"
    )


@pytest.mark.parametrize("pattern", [r"(?:blk)\.1\.", r"blk(?!\.0\.)", r"\(?blk", r"[(?]blk"])
def test_groups_stdregex_reads_are_accepted(pattern):
    r = run(*FIT_ROOMY, "-ot", f"{pattern}=CPU")
    assert r.exit_code == 0, r.output


# -- -ts -------------------------------------------------------------------------------------------------------------
# common/arg.cpp:2833-2851: split at [,/]+ by std::sregex_token_iterator (no empty trailing part), std::stof each.

@pytest.mark.parametrize(("given", "same_as"), [("1,", "1"), ("3/1", "3,1"), ("1_0,1", "1,1"), ("0x10,1", "16,1"),
                                                ("2.5e0x,1", "2.5,1")])
def test_tensor_split_reads_as_stof(given, same_as):
    base = ("capacity", "-m", "lfm2-1.2b", "--budget", "8GiB,8GiB", "--ctx", "4k", "--host-budget", "64GiB")
    assert answer(*base, "-ts", given) == answer(*base, "-ts", same_as)


@pytest.mark.parametrize(("ts", "message"), [
    ("1e308,1", "--tensor-split: '1e308' is outside the float range llama.cpp reads the parts in (std::stof refuses "
                "it)"),
    ("1e-40,1", "--tensor-split: '1e-40' is outside the float range llama.cpp reads the parts in (std::stof refuses "
                "it)"),
    ("3e38,3e38", "--tensor-split parts add up past the float range; give smaller proportions (3,1)"),
    (",1", "--tensor-split: cannot read '' as a proportion (example: 3,1)"),
], ids=["1e308", "subnormal", "sum past FLT_MAX", "leading comma"])
def test_tensor_split_out_of_float_range(ts, message):
    assert one_line_error(run(*FIT_TWO, "-ts", ts)) == message


@pytest.mark.parametrize("ts", ["0,0", "0", ""])
def test_an_all_zero_split_leaves_fit_free(ts):
    # src/llama-model.cpp:1557: all zero = the default split by free memory; common/fit.cpp:470-474 aborts only on a
    # non-zero part
    assert answer(*FIT_TWO, "-ts", ts) == answer(*FIT_TWO)


def test_a_nonzero_split_stops_fit():
    r = run(*FIT_TWO, "-ts", "1,0")
    assert r.exit_code == 1, r.output
    assert "--fit gives up: model_params::tensor_split already set by user, abort" in r.output


# -- --quant numbers -------------------------------------------------------------------------------------------------
# tools/quantize/quantize.cpp:92-117 try_parse_ftype: a name, else std::stoi (ASCII digits, int32)

@pytest.mark.parametrize(("quant", "shown"), [
    ("9" * 5000, "9" * 37 + "..."), ("\u0661\u0665", "\u0661\u0665"), ("99999999999999999999", "99999999999999999999"),
], ids=["5000 digits", "Arabic-Indic 15", "past int64"])
def test_quant_numbers_stoi_refuses(quant, shown):
    assert one_line_error(run("estimate", "-m", "lfm2-1.2b", "--quant", quant)).startswith(
        f"unknown --quant '{shown}' (llama-quantize accepts: "
    )
