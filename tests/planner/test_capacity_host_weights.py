"""``rsplan capacity`` charges the host weights a started llama-server holds for the printed command:
the ``CPU_Mapped`` span of the file with mmap, the ``CPU_REPACK`` buffer ON TOP of it, the GPUs' pinned host buffer
without mmap; and prints the flags that reproduce it.

Expected bytes are derived here from the tensor table (llama-quantize Q4_0 of mamba-130m's bf16 GGUF, file order,
each tensor padded to the 32-byte data alignment), not by calling planner.weights.host_weights; one case is checked
against real llama.cpp runs (tests/golden/llamacpp-breakdown/buffer-types)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.weights.quant_weights import quantized_weights

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llamacpp-breakdown" / "buffer-types"
BASE = ["--budget", "8GiB", "--host-budget", "64GiB", "--ctx", "4k", "--compute", "0"]


def pad32(n: int) -> int:
    return (n + 31) // 32 * 32


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args), prog_name="rsplan")
    return r.exit_code, r.output


def capacity_json(*args: str) -> dict:
    code, out = run("capacity", *args, "--format", "json")
    assert code == 0, out
    return json.loads(out)


def host_row(d: dict) -> dict:
    (row,) = [r for r in d["devices"] if r["name"] == "host"]
    return row


@pytest.fixture(scope="module")
def mamba_q4_0() -> list:
    """mamba-130m's Q4_0 tensors in file order (output_norm, token_embd, then blk.0 ... blk.23 by name)."""
    return list(quantized_weights(load_builtin_preset("mamba-130m"), "Q4_0").plan.tensors)


def _repacked(tensors: list) -> list:
    """The tensors an AVX2 build repacks: repack.cpp:4925 takes a Q4_0 matrix with ne[1] % 8 == 0; every Q4_0
    tensor here is a 2-D MUL_MAT weight (ssm_in, ssm_out, ssm_x: 3 per layer)."""
    q4 = [t for t in tensors if t.type == "q4_0"]
    assert {t.name.split(".", 2)[2] for t in q4} == {"ssm_in.weight", "ssm_out.weight", "ssm_x.weight"}
    assert all(len(t.ne) == 2 and t.ne[1] % 8 == 0 for t in q4) and len(q4) == 24 * 3
    return q4


def test_cpu_only_mapped_and_repacked_host_charge_by_hand(mamba_q4_0):
    # --device-kind RPC has no host buffer type, -ngl 0 keeps every weight on the host: the CPU-only layout
    tensors = mamba_q4_0
    per_layer = 1_327_104 + 663_552 + 69_120  # ssm_in (768 x 3072), ssm_out (1536 x 768), ssm_x (1536 x 80) in Q4_0
    assert sum(t.n_bytes for t in _repacked(tensors)) == 24 * per_layer
    repack = 24 * per_layer  # each a multiple of 32 already: CPU_REPACK = 49,434,624 bytes
    file_end = sum(pad32(t.n_bytes) for t in tensors)
    # the file ends with blk.23's three repacked tensors, so the mapped span (output_norm at offset 0 up to the end
    # of blk.23.ssm_dt.weight, the last tensor left in CPU) is the file less those three
    assert [t.name for t in tensors[-3:]] == ["blk.23.ssm_in.weight", "blk.23.ssm_out.weight", "blk.23.ssm_x.weight"]
    assert tensors[-4].type != "q4_0"
    span = file_end - per_layer
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "--device-kind", "RPC", "-ngl", "0", *BASE)
    host = host_row(d)
    assert host["weight_buffers"] == {"CPU_Mapped": span, "CPU_REPACK": repack}
    assert host["weights_bytes"] == span + repack == file_end + 23 * per_layer
    # inside the span: the 23 other layers' repacked tensors and token_embd's padding (31,676,400 = 32k + 16)
    assert [t.n_bytes % 32 for t in tensors if t.name == "token_embd.weight"] == [16]
    assert host["mapped_elsewhere_bytes"] == 23 * per_layer + 16
    assert (host["load_mode"], host["cpu_repack"]) == ("auto", "x86-avx2")
    assert d["flags"] == "-c 4096 -np 1 -ngl 0"  # llama.cpp's defaults: nothing to add
    assert any("CPU_Mapped" in n and "--load-mode auto, --cpu-repack x86-avx2" in n for n in d["notes"])


def test_no_mmap_reads_the_weights_into_buffers(mamba_q4_0):
    file_end = sum(pad32(t.n_bytes) for t in mamba_q4_0)
    repack = sum(t.n_bytes for t in _repacked(mamba_q4_0))
    # without mmap on a CPU-only layout: CPU holds the rest, padded; the total is the dry run's (repacking keeps it)
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "--device-kind", "RPC", "-ngl", "0", "--no-mmap", *BASE)
    assert host_row(d)["weight_buffers"] == {"CPU": file_end - repack, "CPU_REPACK": repack}
    assert d["flags"] == "-c 4096 -np 1 -ngl 0 --load-mode none"
    # with a CUDA device its pinned host buffer type comes first and takes every host weight, padded to 32
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "-ngl", "0", "--load-mode", "none", *BASE)
    assert host_row(d)["weight_buffers"] == {"CUDA_Host": file_end}
    assert any("nothing repacked: the devices' host buffer type CUDA_Host comes before CPU_REPACK" in n
               for n in d["notes"])
    assert host_row(d)["weights_bytes"] == file_end and host_row(d)["mapped_elsewhere_bytes"] == 0
    # ... and with mmap the loader swaps it for CPU: one mapped span of the whole file (nothing repacked)
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "-ngl", "0", *BASE)
    assert host_row(d)["weight_buffers"] == {"CPU_Mapped": file_end}


def test_no_host_leaves_the_pinned_buffer_out_and_repacks(mamba_q4_0):
    # --no-host drops CUDA_Host from the host weights' buffer list (src/llama-model.cpp:1078 make_cpu_buft_list):
    # without mmap they are laid out as on a CPU-only build, CPU_REPACK for the 72 repacked matrices and CPU for the
    # rest (each padded to 32), and the printed command carries --no-host
    file_end = sum(pad32(t.n_bytes) for t in mamba_q4_0)
    repack = sum(t.n_bytes for t in _repacked(mamba_q4_0))
    assert repack == 49_434_624 and file_end - repack == 38_683_648
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "-ngl", "0", "--load-mode", "none", "--no-host", *BASE)
    assert host_row(d)["weight_buffers"] == {"CPU": file_end - repack, "CPU_REPACK": repack}
    assert d["flags"] == "-c 4096 -np 1 -ngl 0 --no-host --load-mode none"
    assert not any("nothing repacked" in n for n in d["notes"])
    # with mmap the CUDA_Host entry is swapped for CPU anyway; --no-host then lets the CPU repack, on top of the span
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "-ngl", "0", "--no-host", *BASE)
    assert set(host_row(d)["weight_buffers"]) == {"CPU_Mapped", "CPU_REPACK"}

def test_partly_offloaded_span_covers_the_host_layers(mamba_q4_0):
    # -ngl 13 of 25 units offloads blk.12 ... blk.23 and the output layer (output_norm, at offset 0): the host keeps
    # token_embd and blk.0 ... blk.11, one span from token_embd to the end of blk.11's last tensor
    tensors = mamba_q4_0
    assert tensors[0].name == "output_norm.weight" and tensors[1].name == "token_embd.weight"
    last = max(i for i, t in enumerate(tensors) if t.name.startswith("blk.11."))
    assert tensors[last + 1].name.startswith("blk.12.") and tensors[last].n_bytes % 32 == 0
    span = sum(pad32(t.n_bytes) for t in tensors[1:last + 1])
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", "-ngl", "13", *BASE)
    assert host_row(d)["weight_buffers"] == {"CPU_Mapped": span}
    assert d["flags"] == "-c 4096 -np 1 -ngl 13"


def _alloc_cases() -> list[tuple[str, int]]:
    return [(p.stem, i) for p in sorted(GOLDEN.glob("*.json"))
            for i, c in enumerate(json.loads(p.read_text())["cases"]) if c["flags"].get("--alloc")]


@pytest.mark.parametrize("case", _alloc_cases(), ids=lambda c: f"{c[0]}-{c[1]}")
def test_matches_real_llama_cpp_runs(case):
    # llama.cpp 0c1e57098 on an AVX2 CPU, real runs (--alloc) of skeleton GGUFs with and without mmap and
    # repacking: their weight buffers are the host's when every layer stays there on a device kind without a host
    # buffer type (the skeleton's table: hparams.tensors' order, llama-quantize's types, as the golden test reads it)
    from rsplan.hparams.tensors import tensor_list
    from rsplan.planner.backends.cpu_repack import parse_target
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.capacity.budget import make_planners
    from rsplan.planner.capacity.limits import DeviceBudget
    from rsplan.planner.capacity.request import BudgetRequest
    from rsplan.planner.weights.host_weights import HostOptions, WeightTable

    name, i = case
    data = json.loads((GOLDEN / f"{name}.json").read_text())
    c = data["cases"][i]
    assert "avx2" in data["cpu_features"] and "avx512f" not in data["cpu_features"]
    spec = load_builtin_preset(data["model"]["preset"])
    planned = {t.name: t for t in quantized_weights(spec, data["model"]["quant"]).plan.tensors}
    infos = tensor_list(spec)
    table = WeightTable([(t.name, planned[t.name].n_bytes) for t in infos],
                        [(planned[t.name].type, t.shape[0]) for t in infos], [t.shape for t in infos], 32)
    spec = spec.model_copy(update={"weights_bytes": sum(n for _, n in table.tensors)})
    host = HostOptions(parse_target("none" if c["flags"].get("--no-extra-bufts") else "x86-avx2"),
                       use_mmap=not c["flags"].get("--no-mmap"))
    request = BudgetRequest(devices=(DeviceBudget("GPU", 8 << 30, "test"),), n_gpu_layers=0, device_kind="RPC",
                            host=host)
    (p,) = make_planners([spec], [name], ContextParams(n_ctx=4096), request, tables=[table])
    measured = {b: v["model"] for b, v in c["breakdown"].items() if v["model"]}
    hw = p.host_weights()
    assert hw is not None and hw.buffers == measured
    assert p.weights_on_host == sum(measured.values())


@pytest.mark.parametrize(("flags", "printed"), [
    ((), ""),
    (("--no-mmap",), " --load-mode none"),
    (("--load-mode", "mmap+mlock"), " --load-mode mmap+mlock"),
    (("--load-mode", "dio"), " --load-mode dio"),
    (("--no-repack",), " --no-repack"),
    (("--cpu-repack", "none", "--load-mode", "mlock"), " --no-repack --load-mode mlock"),
    (("--cpu-repack", "arm-i8mm"), ""),  # the build's CPU, not a flag
])
def test_printed_commands_carry_the_host_flags(flags, printed):
    # only flags llama.cpp 0c1e57098 accepts: common/arg.cpp:2423 -nr/--no-repack, :2691 -lm/--load-mode MODE
    # (auto, none, mmap, mlock, mmap+mlock, dio); it has no --no-mmap
    d = capacity_json("-m", "mamba-130m", "--quant", "Q4_0", *flags, *BASE)
    assert d["flags"] == "-c 4096 -np 1 -ngl all" + printed
    assert d["ladder"][0]["flags"].endswith("-ngl all" + printed)
    assert d["max_ctx"]["flags"].endswith("-ngl all" + printed)


@pytest.mark.parametrize("command", ["capacity", "report", "fit"])
@pytest.mark.parametrize(("flags", "message"), [
    (("--no-repack", "--cpu-repack", "arm-neon"), "Error: --no-repack and --cpu-repack arm-neon contradict each other"),
    (("--no-mmap", "--load-mode", "mmap"), "Error: --no-mmap and --load-mode mmap contradict each other"),
])
def test_contradictions_are_one_line_errors(tmp_path, command, flags, message):
    out_file = tmp_path / "r.html"
    extra = {"capacity": BASE, "report": [*BASE, "-o", str(out_file)], "fit": ["--host-budget", "16GiB"]}[command]
    code, out = run(command, "-m", "mamba-130m", "--quant", "Q4_0", *flags, *extra)
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert out.startswith(message)
    assert not out_file.exists()


def test_unknown_target_and_serving_engines_are_refused():
    code, out = run("capacity", "-m", "mamba-130m", "--cpu-repack", "x86-sse", *BASE)
    assert code == 2 and "unknown target (have: none, x86-avx2" in out and len(out.strip().splitlines()) == 1
    code, out = run("capacity", "-m", "mamba-130m", "--engine", "vllm", "--no-mmap", "--budget", "80GiB")
    assert code == 1 and out.strip() == ("Error: --no-mmap is a llama.cpp flag; --engine vllm does not read it "
                                         "(see 'rsplan capacity --help' for each engine's flags)")


def test_without_a_tensor_table_the_host_keeps_the_dry_run_total():
    # --weights gives a size, not tensors: the share left on the host is charged as a total, and said so
    d = capacity_json("-m", "mamba-130m", "--weights", "1GiB", "-ngl", "0", "--no-mmap", *BASE)
    assert host_row(d)["weight_buffers"] is None and host_row(d)["weights_bytes"] == 1 << 30
    assert any(n.startswith("host weights: 1.00 GiB, as llama.cpp's dry run reads them") for n in d["notes"])
    assert d["flags"].endswith("--load-mode none")


def fit_json(*args: str) -> dict:
    code, out = run("fit", "-m", "mamba-130m", "--quant", "Q4_0", "--host-budget", "16GiB", *args, "--format", "json")
    assert code == 0, out
    return json.loads(out)


def test_fit_keeps_the_dry_run_and_prints_the_flags(mamba_q4_0):
    # common/fit.cpp:58 measures with LLAMA_LOAD_MODE_NONE whatever --load-mode says, and repacking keeps a dry run's
    # bytes: the fit is the same; the printed command and rsplan's own host check (a started server) change
    plain = fit_json()
    given = fit_json("--no-mmap", "--no-repack")
    assert given["command"] == plain["command"].replace(" --fit off", " --no-repack --load-mode none --fit off")
    mine = ("command", "run_command", "host_check", "notes")
    assert {k: v for k, v in given.items() if k not in mine} == {k: v for k, v in plain.items() if k not in mine}
    # no device: the dry run's host weights are the padded tensors; started with mmap and AVX2 repacking the host
    # holds the span up to blk.23's repacked tensors plus the repacked copy (as capacity charges it, by hand above)
    file_end = sum(pad32(t.n_bytes) for t in mamba_q4_0)
    per_layer = 1_327_104 + 663_552 + 69_120
    assert plain["host"]["model"] == given["host"]["model"] == file_end
    assert plain["host_check"]["items"][0] == {
        "what": f"weights on the host (CPU_Mapped {file_end - per_layer:,} B + CPU_REPACK {24 * per_layer:,} B)",
        "bytes": file_end - per_layer + 24 * per_layer, "grows": False}
    assert given["host_check"]["items"][0] == {"what": f"weights on the host (CPU {file_end:,} B)",
                                               "bytes": file_end, "grows": False}
    assert any(n.startswith("host check: the weights as a started llama-server holds them under --load-mode none, "
                            "--cpu-repack none") for n in given["notes"])
    assert fit_json("--load-mode", "mmap+mlock")["command"].endswith("--load-mode mmap+mlock --fit off")
    code, out = run("fit", "-m", "mamba-130m", "--quant", "Q4_0", "--cpu-repack", "arm-neon")
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert out.startswith("Error: --cpu-repack arm-neon: rsplan fit measures llama.cpp's --fit dry run")


def test_report_charges_and_prints_the_same(tmp_path):
    pytest.importorskip("plotly")
    out = tmp_path / "r.html"
    code, text = run("report", "-m", "mamba-130m", "--quant", "Q4_0", "--device-kind", "RPC", "-ngl", "0",
                     "--no-mmap", *BASE, "-o", str(out))
    assert code == 0, text
    html = out.read_text()
    assert "-c 4096 -np 1 -ngl 0 --load-mode none" in html
    assert "under --load-mode none, --cpu-repack x86-avx2 (CPU_REPACK 49,434,624 B + CPU 38,683,648 B)" in html


def test_host_options_flags_and_their_agreement():
    from rsplan.planner.backends.cpu_repack import parse_target
    from rsplan.planner.weights.host_weights import HostOptions

    assert HostOptions().flags() == [] and HostOptions().mode == "auto"
    assert HostOptions(use_mmap=False).flags() == ["--load-mode none"]
    assert HostOptions(parse_target("none"), True, "mmap").flags() == ["--no-repack", "--load-mode mmap"]
    assert HostOptions(parse_target("arm-neon")).describe() == "--load-mode auto, --cpu-repack arm-neon"
    with pytest.raises(ValueError, match="load mode 'none' with use_mmap=True"):
        HostOptions(use_mmap=True, load_mode="none")
