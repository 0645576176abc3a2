"""Survey: reserve graphs kept over the KV cells (planner.compute.reuse.kept_shapes) against the ordinary sizing, on
every preset.

For each preset in presets/ and each setting of a grid, a series of contexts per sequence is sized twice:

- kept: ``planner.compute.per_device.device_compute`` (split graphs kept in a sizing session's ``device_shapes``, from
  a key's first query) and ``planner.compute.reserve.compute_buffer`` (CPU graphs kept in its ``cpu_shapes``, from a
  key's second query: each CPU context is asked twice, so that the second answer comes from kept graphs);
- ordinary: the same sizing with every graph built and scheduled at that context (``device_compute._size``, and
  ``compute._reserve`` over ``compute.reserves``), no kept graphs.

Which path the kept call took is read from the cache's statistics (``built``, ``reused``, ``ordinary``); a call
sized the ordinary way is a fallback, and its reason is found by building the graphs with the symbolic cells again
and reporting what that raised. An error (a ContextError or an abort of llama.cpp's) must be the same on both sides.

Grid (defaults): placements one CUDA device / two RPC devices with half the layers and ``-ts 1,3`` / ``-nkvo``;
``-np 1, 3``; ``-fa auto, on, off``; K cache f16, q8_0; ``-ub 512, 300``; the real run and the dry run; contexts per
sequence 4096, 256, 40960, 1000 (not a multiple of 256), 196608. Extras on a smaller grid (-ub 512, K f16, -fa auto
and off): ``--n-rs-seq 2`` where the arch keeps rollback planes, ``-kvu``, and the ``--spec-type mtp`` draft where
the preset has nextn layers.

Options for what the base grid leaves out (docs/sizing.md s.7a): ``--offload`` adds partial-offload placements
(``OFFLOAD``: -ngl half, 1 (the output layer alone on the device) and 0 (the output layer on the host), one and two
devices, -ts uneven), ``--moe`` the expert placements on presets with experts (``MOE``: --n-cpu-moe, --cpu-moe,
-ot to the host and to a device, with -nkvo and with partial offload), ``--outputs`` the output-count rules
(llama-cli's n_batch, a server's --draft 3 and 16, n_outputs_max 0 and 7), and ``--commands`` runs rsplan capacity
and rsplan fit (``commands``) in this process with kept graphs and with them off
(planner.compute.reuse.kept_shapes.KEPT), comparing their JSON outputs and exit codes byte for byte. ``--no-base``
leaves the base product out.

``--stand-ins`` gives a preset without a compute model (the article's 48-layer example: no vocabulary size, no FFN
width) the values of STAND_INS, so that its graphs are compared too.

Run (niced, one slice of presets at a time, with a log; the whole grid is hours of CPU: qwen3-next-80b-a3b's 30
series took 1,148 s, qwen3.5-35b-a3b's 34 took 784 s on a shared 2-vCPU machine):
    nice -n 10 .venv/bin/python benchmarks/survey_kept_shapes.py --presets qwen3-next-80b-a3b,rwkv7-0.4b-world \
        --log /tmp/survey.log
    nice -n 10 .venv/bin/python benchmarks/survey_kept_shapes.py --stand-ins --placements cuda-ngl-half --offload \
        --moe --no-extras --np 1,3 --fa auto,off --types f16 --ub 512 --contexts 4096,1000,256 --no-cpu
    nice -n 10 .venv/bin/python benchmarks/survey_kept_shapes.py --stand-ins --commands --no-base --no-extras \
        --no-cpu --no-device
    nice -n 10 .venv/bin/python benchmarks/survey_kept_shapes.py --stand-ins --outputs --no-base --no-extras \
        --placements cuda,rpc2 --contexts 4096,1000,256
Exit status 1 when anything mismatched.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.reuse.session import SizingSession

PLACEMENTS = ("cuda", "rpc2", "nkvo")
#: --offload: partial offload, one and two devices, the output layer on a device or on the host, -ts uneven
OFFLOAD = ("cuda-ngl-half", "cuda-ngl1", "cuda-ngl0", "cuda2-ts", "cuda2-ngl-last", "rpc2-ngl1", "rpc2-ngl0")
#: --moe: experts on the host (--n-cpu-moe, --cpu-moe, -ot to the host and to a device), on presets with experts
MOE = ("cuda-ncmoe", "cuda-cpumoe", "cuda2-ot", "rpc2-ncmoe-half", "cuda-ncmoe-nkvo")
CONTEXTS = (4096, 256, 40960, 1000, 196608)
#: With --stand-ins, what a preset without a compute model (no vocabulary size) lacks of these is given: the
#: article's 48-layer example (no vocabulary, no FFN width), mamba2-2.7b (no vocabulary; its graph has no FFN).
#: Qwen3.5's vocabulary, 3 x the example's hidden size.
STAND_INS = {"vocab_size": 248320, "feed_forward_length": 6144}


def setups(n_layer_all: int, moe: bool = False, tensors: Any = None) -> dict[str, Any]:
    """The placements of tests/planner/test_device_compute_shapes.py (``PLACEMENTS``), then partial offload
    (``OFFLOAD``) and, with ``moe``, experts moved by ``--n-cpu-moe`` and ``-ot`` (``MOE``); each with the model's
    ``tensors`` (planner.weights.layer_tensors.LayerTensors: a weight an offloaded op reads is copied to the device in
    its type)."""
    from rsplan.planner.backends.devices import DEVICE_KINDS
    from rsplan.planner.compute.sched_setup import SchedSetup
    from rsplan.planner.weights.placement import place_layers
    from rsplan.planner.weights.weight_placement import FFN_EXPS_REGEX, TensorOverride, n_cpu_moe_overrides

    cuda, rpc, n = DEVICE_KINDS["CUDA"], DEVICE_KINDS["RPC"], n_layer_all
    half = n // 2
    out = {
        "cuda": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None)),
        "rpc2": SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=half, tensor_split=[1.0, 3.0])),
        "nkvo": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None, offload_kqv=False), (), False),
        # partial offload: -ngl counts from the last unit (the output layer), so -ngl 1 is the output layer
        # alone on the device and -ngl 0 leaves it on the host (the devices still take big batches' ops)
        "cuda-ngl-half": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=half)),
        "cuda-ngl1": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=1)),
        "cuda-ngl0": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=0)),
        "cuda2-ts": SchedSetup(cuda, place_layers(n, 2, n_gpu_layers=None, tensor_split=[5.0, 2.0])),
        "cuda2-ngl-last": SchedSetup(cuda, place_layers(n, 2, n_gpu_layers=n, tensor_split=[2.0, 1.0])),
        "rpc2-ngl1": SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=1, tensor_split=[3.0, 1.0])),
        "rpc2-ngl0": SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=0)),
    }
    if moe:
        every = (TensorOverride(rf"blk\.[0-9]+{FFN_EXPS_REGEX}", "CPU"),)
        out |= {
            "cuda-ncmoe": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None),
                                     tuple(n_cpu_moe_overrides(max(1, half)))),
            "cuda-cpumoe": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None), every),
            "cuda2-ot": SchedSetup(cuda, place_layers(n, 2, n_gpu_layers=None, tensor_split=[1.0, 3.0]),
                                   (TensorOverride(r"blk\.1\.ffn_.*_exps", 0),
                                    TensorOverride(r"blk\.[2-5]\.ffn_.*_exps", "CPU"))),
            "rpc2-ncmoe-half": SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=half, tensor_split=[1.0, 3.0]),
                                          tuple(n_cpu_moe_overrides(n))),
            "cuda-ncmoe-nkvo": SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None, offload_kqv=False),
                                          tuple(n_cpu_moe_overrides(2)), False),
        }
    return {k: dataclasses.replace(v, tensors=tensors) for k, v in out.items()}


@dataclasses.dataclass(frozen=True)
class Series:
    """One setting whose contexts are sized in turn (all but the cells the same)."""

    n_seq: int
    fa: str
    type_k: str
    n_ubatch: int
    type_v: str = "f16"
    n_rs_seq: int = 0
    kv_unified: bool = False
    mtp: bool = False
    tool: str = "server"
    n_draft: int = 0
    n_outputs_max: int | None = None

    @property
    def n_out(self) -> int | None:
        """The n_outputs_max passed: the draft context's outputs as planner.fit.draft asks (MTP), else the
        series' own (None: the tool's)."""
        return self.n_seq if self.mtp else self.n_outputs_max

    def params(self, c: int) -> Any:
        from rsplan.planner.caches.context import ContextParams

        return ContextParams(n_ctx=c * self.n_seq, n_seq_max=self.n_seq, flash_attn=self.fa, type_k=self.type_k,
                             type_v=self.type_v, n_ubatch=self.n_ubatch, n_rs_seq=self.n_rs_seq,
                             kv_unified=self.kv_unified)

    def label(self) -> str:
        extra = (f" rs{self.n_rs_seq}" if self.n_rs_seq else "") + (" kvu" if self.kv_unified else "") + (
            " mtp" if self.mtp else "") + (f" {self.tool}" if self.tool != "server" else "") + (
            f" draft{self.n_draft}" if self.n_draft else "") + (
            f" nout{self.n_outputs_max}" if self.n_outputs_max is not None else "")
        v = f" V={self.type_v}" if self.type_v != "f16" else ""
        return f"np{self.n_seq} fa={self.fa} K={self.type_k}{v} ub{self.n_ubatch}{extra}"


def series_of(spec: Any, layout: Any, args: argparse.Namespace) -> list[Series]:
    """The grid for one preset: the base product, then the extras on a smaller one. With MLA (kimi-linear) V takes
    K's type, which llama.cpp requires there (a quantized V then needs flash attention: -fa off is refused)."""
    mla = layout.arch.mla
    out = [] if args.no_base else [Series(n, fa, tk, ub, type_v=tk if mla else "f16")
                                   for n, fa, tk, ub in itertools.product(args.np, args.fa, args.types, args.ub)]
    small = list(itertools.product(args.np, ("auto", "off")))
    if args.outputs:
        # the output-count rules: llama-cli's n_batch, the server's n_parallel * (1 + n_draft) capped at -b, and
        # n_outputs_max given (0 = n_batch); -ub 300 with llama-cli (its pp graph's outputs are the ubatch)
        out += [Series(n, fa, "f16", ub, tool="cli") for n, fa in small for ub in (512, 300)]
        out += [Series(n, fa, "f16", 512, n_draft=d) for n, fa in small for d in (3, 16)]
        out += [Series(n, fa, "f16", 512, n_outputs_max=m) for n, fa in small for m in (0, 7)]
    if args.no_extras:
        return out
    if layout.arch.rollback:
        out += [Series(n, fa, "f16", 512, n_rs_seq=2) for n, fa in small]
    out += [Series(n, fa, "f16", 512, kv_unified=True) for n, fa in small if n > 1]
    if spec.nextn_predict_layers:
        out += [Series(n, fa, "f16", 512, mtp=True) for n, fa in small]
    return out


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _call(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """``fn(*args, **kwargs)`` and None, or None and the error it raised."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # an error is a result: both sides must give the same one
        return None, _err(exc)


#: The counts of a ShapeCache's ``stats``.
_STATS = ("built", "reused", "raised", "ordinary")


def _delta(stats: dict[str, int], before: dict[str, int]) -> str:
    changed = [k for k in ("built", "reused", "ordinary") if stats[k] != before[k]]
    return "+".join(changed) or "none"


def commands(spec: Any, layout: Any) -> list[list[str]]:
    """The ``--commands`` part: rsplan capacity ladders and rsplan fit searches of one preset (all with a fixed
    host budget, which otherwise is this machine's available memory and differs between runs), with one and two
    devices, CUDA, RPC and SYCL (no scheduler model: the CPU figure, planner.compute.reserve), -ngl half / 1 / 0, -ts
    uneven, -nkvo, -np 1 to 4, -fa off, a q8_0 K cache with -ub 300, a speculative draft (--spec-type: n_rs_seq and
    the server's outputs); fit also without devices (a CPU-only build), with --tool cli, and with the experts on the
    host (--n-cpu-moe, --cpu-moe, -ot) where the preset has experts."""
    n, half = layout.n_layer_all, layout.n_layer_all // 2
    from rsplan.planner.weights.quant_weights import quantized_weights

    # budgets in GiB for a model of up to 6 GiB of Q4_K_M weights, scaled up for larger ones
    quant = ["--quant", "Q4_K_M"] if spec.vocab_size else []
    q4 = sum(b for _, b in quantized_weights(spec, "Q4_K_M").table) if quant else 0
    scale = max(1, -(-q4 // (6 * 2**30)))

    def gib(*sizes: int) -> str:
        return ",".join(f"{g * scale}GiB" for g in sizes)

    host = ["--host-budget", "256GiB", "--format", "json"]
    from rsplan.planner.caches.context_limit import context_limit

    top = min(context_limit(spec).tokens, 262144)  # a ladder stops at the model's limit (what capacity refuses past)
    ladder = ["--ctx", ",".join(str(c) for c in sorted({min(c, top) for c in (4096, 16384, 40000, top // 3, top)}))]
    short = ["--ctx", ",".join(str(c) for c in sorted({min(c, top) for c in (4096, 40000, top)}))]
    cap = [["--budget", gib(24), *ladder],
           ["--budget", gib(80), "-np", "3", "-fa", "off", *short],
           ["--budget", gib(24, 24), "--device-kind", "RPC", "-ts", "1,3", "-ngl", str(half), "-np", "2", *ladder],
           ["--budget", gib(16), "-ngl", "1", "-np", "4", *short],
           ["--budget", gib(8), "-ngl", "0", "-np", "2", *short],
           ["--budget", gib(16), "-nkvo", "-np", "2", *short],
           ["--budget", gib(12, 6), "-ts", "5,2", "-ctk", "q8_0", "-ub", "300", "-np", "3", *short],
           ["--budget", gib(24), "--device-kind", "SYCL", "-np", "2", *short],
           ["--budget", gib(48), "--spec-type", "mtp" if spec.nextn_predict_layers else "eagle3", "--draft-max", "4",
            "-np", "2", *ladder]]
    fit = [["-c", "32768", "-np", "2"],
           ["--budget", gib(24), "-np", "2"],
           ["--budget", gib(12, 12), "--tool", "cli", "-np", "3"],
           ["--budget", gib(8, 8), "--device-kind", "RPC", "-ngl", str(n), "-ts", "2,1"],
           ["--budget", gib(24), "-np", "4", "-ub", "300", "-ctk", "q8_0", "-fa", "on"]]
    if spec.nextn_predict_layers:  # fit models no other draft
        fit.append(["--budget", gib(24), "--spec-type", "mtp", "--draft-max", "3"])
    if spec.expert_count:
        fit += [["--budget", gib(8), "-ncmoe", str(max(1, half))],
                ["--budget", gib(8), "-cmoe", "-np", "2"],
                ["--budget", gib(16, 8), "-ot", r"blk\.[0-9]+\.ffn_.*_exps=CPU"]]
    return ([["capacity", "-m", spec.name, *c, *quant, *host] for c in cap]
            + [["fit", "-m", spec.name, *c, *quant, *host] for c in fit])


class Survey:
    def __init__(self, args: argparse.Namespace, log: Any) -> None:
        self.args, self.log = args, log
        self.summary: dict[str, Any] = {}

    def say(self, line: str) -> None:
        print(line, flush=True)
        if self.log:
            self.log.write(line + "\n")
            self.log.flush()

    # -- device_compute ----------------------------------------------------------------------------------------

    def device_series(self, rec: dict[str, Any], spec: Any, layout: Any, all_setups: dict[str, Any],
                      s: Series) -> None:
        """Each context in turn under every placement and run (so that the ordinary sizing finds the graphs it
        built at that context for the placement before: a session keeps the last ones); the session's device shapes
        hold a key per placement and run meanwhile, so that each key's contexts are sized on its kept graphs."""
        from rsplan.planner.caches.context import resolve_context
        from rsplan.planner.compute import per_device as dc
        from rsplan.planner.compute.reserve import draft_layout_and_params, paused_gc, reserve_graph_builder
        from rsplan.planner.compute.reuse.kept_shapes import symbolic_context
        from rsplan.planner.compute.reuse.kv_affine import KCells

        n_out = s.n_out
        runs = [(where, mode) for where in self.args.placements if where in all_setups for mode in self.args.modes]
        session = SizingSession()
        shapes = session.device_shapes
        shapes.size = max(shapes.size, 2 * len(runs))  # with -np 1, -c 256 runs its own ubatch: a key of its own
        reasons: dict[tuple[str, str], str] = {}
        for c in self.args.contexts:
            params = s.params(c)
            for where, mode in runs:
                setup = all_setups[where]
                before = dict(shapes.stats)
                got, got_err = _call(dc.device_compute, spec, params, setup, OutputsAsked(s.tool, s.n_draft, n_out),
                                     layout=layout, runs=mode, mtp_draft=s.mtp, session=session)
                path = _delta(shapes.stats, before)

                def ordinary(params: Any, setup: Any, mode: str) -> Any:
                    build = reserve_graph_builder(spec, s.mtp)
                    lay, par = (draft_layout_and_params(spec, layout, params) if s.mtp else (layout, params))
                    run = dc._Run(build, spec, lay, par.flash_attn, setup, OutputsAsked(s.tool, s.n_draft, n_out), mode)
                    ctx = resolve_context(lay, par)
                    with paused_gc():
                        return dc._size(run, ctx), run, ctx

                want, want_err = _call(ordinary, params, setup, mode)
                what = f"device {where} {s.label()} {mode} c={c}/seq"
                self.compare(rec, "device", what, got, got_err, want[0] if want else None, want_err, path)
                if path == "ordinary" and want is not None:
                    if (where, mode) not in reasons:
                        _, run, ctx = want
                        k = ctx.n_ctx_seq // 256
                        kept_run = dataclasses.replace(run, session=SizingSession())
                        _, reason = _call(dc._Splits, kept_run, ctx, symbolic_context(ctx, KCells(k)))
                        reasons[(where, mode)] = reason or "(the symbolic build succeeds now: tried before)"
                    rec["fallbacks"].append(f"{what}: {reasons[(where, mode)]}")
                    self.say(f"  FALLBACK {what}: {reasons[(where, mode)]}")

    # -- compute_buffer ----------------------------------------------------------------------------------------

    def cpu_series(self, rec: dict[str, Any], spec: Any, layout: Any, s: Series) -> None:
        from rsplan.planner.caches.context import resolve_context
        from rsplan.planner.compute import reserve as compute
        from rsplan.planner.compute.reuse.kept_shapes import symbolic_context
        from rsplan.planner.compute.reuse.kv_affine import KCells

        n_out = s.n_out
        session = SizingSession()
        reason = None
        for c in self.args.contexts:
            params = s.params(c)

            def ordinary(params: Any) -> Any:
                build = compute.reserve_graph_builder(spec, s.mtp)
                lay, par = (compute.draft_layout_and_params(spec, layout, params) if s.mtp else (layout, params))
                ctx = resolve_context(lay, par)
                n_out_max = compute.n_outputs_max_of(n_out, s.tool, ctx, s.n_draft)
                graphs = [compute._reserve(build, spec, lay, ctx, False, r)
                          for r in compute.reserves(spec, ctx, n_out_max)]
                return graphs, (build, lay, ctx, n_out_max)

            want, want_err = _call(ordinary, params)
            for attempt in (1, 2):  # the second query of a key is sized on kept graphs
                before = dict(session.cpu_shapes.stats)
                got, got_err = _call(compute.compute_buffer, spec, params, OutputsAsked(s.tool, s.n_draft, n_out),
                                     layout=layout, mtp_draft=s.mtp, session=session)
                path = _delta(session.cpu_shapes.stats, before)
                what = f"cpu {s.label()} c={c}/seq query {attempt}"
                self.compare(rec, "cpu", what, list(got.graphs) if got else None, got_err,
                             want[0] if want else None, want_err, path)
                if attempt == 2 and path == "ordinary" and want is not None:
                    if reason is None:
                        build, lay, ctx, n_out_max = want[1]
                        k = ctx.n_ctx_seq // 256
                        _, reason = _call(compute._KeptGraphs, build, spec, lay, symbolic_context(ctx, KCells(k)),
                                          False, n_out_max)
                        reason = reason or "(the symbolic build succeeds now: a key tried before)"
                    rec["fallbacks"].append(f"{what}: {reason}")
                    self.say(f"  FALLBACK {what}: {reason}")
                if path != "ordinary":
                    break

    # -- commands ----------------------------------------------------------------------------------------------

    def command_series(self, rec: dict[str, Any], spec: Any, layout: Any) -> None:
        """Each command of ``commands`` run in this process with kept graphs (planner.compute.reuse.kept_shapes.KEPT)
        and with them off: the outputs (JSON) and exit codes must be equal byte for byte."""
        from click.testing import CliRunner

        from rsplan.cli import cli
        from rsplan.planner.compute.reuse import kept_shapes

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from rsplan_testing import sessions_made  # the tests' recorder of the sessions a command makes

        runner = CliRunner()
        for argv in commands(spec, layout):
            what = "rsplan " + " ".join(argv)
            t0 = time.time()
            with sessions_made() as made:
                kept = runner.invoke(cli, argv)
            t1 = time.time()
            used = {side: {k: sum(getattr(s, f"{side}_shapes").stats[k] for s in made) for k in _STATS}
                    for side in ("device", "cpu")}
            kept_shapes.KEPT = False
            try:
                plain = runner.invoke(cli, argv)
            finally:
                kept_shapes.KEPT = True
            t2 = time.time()
            rec["commands_compared"] += 1
            for side in ("device", "cpu"):
                for k, v in used[side].items():
                    rec[f"commands_{side}_paths"][k] += v
            status = "ok" if kept.exit_code == 0 else f"exit {kept.exit_code}: {kept.output.strip()[:70]}"
            if kept.exception and not isinstance(kept.exception, SystemExit):
                status = f"raised {_err(kept.exception)}"
            rec["command_status"][status[:90]] += 1
            if (kept.output, kept.exit_code) != (plain.output, plain.exit_code):
                rec["mismatches"].append(f"{what}: outputs differ (exit {kept.exit_code} vs {plain.exit_code})")
                self.say(f"  MISMATCH {what}: exit {kept.exit_code} vs {plain.exit_code}, "
                         f"{len(kept.output)} vs {len(plain.output)} chars")
            self.say(f"  {what}: {status}, {len(kept.output)} chars, kept {t1 - t0:.1f} s {used}, "
                     f"off {t2 - t1:.1f} s")

    # -- both --------------------------------------------------------------------------------------------------

    def compare(self, rec: dict[str, Any], side: str, what: str, got: Any, got_err: str | None, want: Any,
                want_err: str | None, path: str) -> None:
        rec[f"{side}_compared"] += 1
        rec[f"{side}_paths"][path] += 1
        if got_err is not None or want_err is not None:
            rec[f"{side}_errors"][(want_err or "")[:90]] += 1
            if got_err != want_err:
                rec["mismatches"].append(f"{what}: kept {got_err or got} vs ordinary {want_err or want}")
                self.say(f"  MISMATCH {what}: kept error {got_err!r} vs ordinary {want_err!r}")
            return
        if got != want:
            rec["mismatches"].append(f"{what}: kept {got} vs ordinary {want}")
            self.say(f"  MISMATCH {what} [{path}]:\n    kept     {got}\n    ordinary {want}")

    def preset(self, name: str) -> dict[str, Any]:
        from rsplan.errors import RsplanError
        from rsplan.hparams.layout import cache_layout
        from rsplan.hparams.sources import load_builtin_preset
        from rsplan.planner.weights.quant_weights import quantized_weights

        spec = load_builtin_preset(name)
        # a preset without a vocabulary size has no compute model: what it lacks of STAND_INS
        missing = {k: v for k, v in STAND_INS.items() if not getattr(spec, k)} if spec.vocab_size is None else {}
        if missing and self.args.stand_ins:
            spec = spec.model_copy(update=missing)
            self.say(f"   {name}: stand-ins for what it does not give: {missing}")
        layout = cache_layout(spec)
        rec: dict[str, Any] = {"device_compared": 0, "cpu_compared": 0, "device_paths": Counter(),
                               "cpu_paths": Counter(), "device_errors": Counter(), "cpu_errors": Counter(),
                               "mismatches": [], "fallbacks": [], "commands_compared": 0,
                               "commands_device_paths": Counter(), "commands_cpu_paths": Counter(),
                               "command_status": Counter()}
        t0 = time.time()
        try:  # the Q8_0 types a weight copied to a device takes (none: such a copy is refused alike on both sides)
            tensors = quantized_weights(spec, "Q8_0").layer_tensors()
        except RsplanError:
            tensors = None
        all_setups = setups(layout.n_layer_all, moe=bool(spec.expert_count), tensors=tensors)
        grid = series_of(spec, layout, self.args)
        self.say(f"== {name} (arch {spec.arch}, {layout.n_layer_all} layers): {len(grid)} series x "
                 f"{len(self.args.contexts)} contexts")
        if self.args.commands:
            self.command_series(rec, spec, layout)
        for s in grid:
            ts = time.time()
            if not self.args.no_cpu:
                self.cpu_series(rec, spec, layout, s)
            if not self.args.no_device:
                self.device_series(rec, spec, layout, all_setups, s)
            self.say(f"  {s.label()}: {time.time() - ts:.1f} s")
        rec["seconds"] = round(time.time() - t0, 1)
        if self.args.commands:
            self.say(f"== {name}: {rec['commands_compared']} commands compared {dict(rec['command_status'])}, kept "
                     f"path: device {dict(rec['commands_device_paths'])}, cpu {dict(rec['commands_cpu_paths'])}")
        self.say(f"== {name}: device {rec['device_compared']} compared {dict(rec['device_paths'])}, "
                 f"cpu {rec['cpu_compared']} compared {dict(rec['cpu_paths'])}, errors (both sides) "
                 f"{sum(rec['device_errors'].values()) + sum(rec['cpu_errors'].values())}, "
                 f"{len(rec['mismatches'])} mismatches, {len(rec['fallbacks'])} fallbacks, {rec['seconds']} s")
        for err, n in (rec["device_errors"] + rec["cpu_errors"]).items():
            self.say(f"   error x{n}: {err}")
        return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from rsplan.hparams.sources import builtin_preset_names

    names = builtin_preset_names()
    csv = lambda f: lambda v: [f(x) for x in v.split(",")]  # noqa: E731
    ap.add_argument("--presets", type=csv(str), default=names, help="comma-separated (default: every preset)")
    ap.add_argument("--placements", type=csv(str), default=list(PLACEMENTS),
                    help=f"of {', '.join(PLACEMENTS + OFFLOAD + MOE)}; the MoE ones on presets with experts only")
    ap.add_argument("--offload", action="store_true", help=f"add the partial-offload placements {', '.join(OFFLOAD)}")
    ap.add_argument("--moe", action="store_true", help=f"add the expert placements {', '.join(MOE)}")
    ap.add_argument("--outputs", action="store_true",
                    help="add llama-cli's outputs, --draft 3 and 16, n_outputs_max 0 and 7 (-fa auto and off)")
    ap.add_argument("--no-base", action="store_true", help="leave out the base product (-fa x K type x -ub)")
    ap.add_argument("--commands", action="store_true",
                    help="run rsplan capacity / fit (see commands()) with kept graphs and with them off "
                         "(planner.compute.reuse.kept_shapes.KEPT) and compare their outputs byte for byte")
    ap.add_argument("--np", type=csv(int), default=[1, 3])
    ap.add_argument("--fa", type=csv(str), default=["auto", "on", "off"])
    ap.add_argument("--types", type=csv(str), default=["f16", "q8_0"], help="K cache types")
    ap.add_argument("--ub", type=csv(int), default=[512, 300])
    ap.add_argument("--modes", type=csv(str), default=["real", "dry"])  # device_compute's runs: real, dry, both
    ap.add_argument("--contexts", type=csv(int), default=list(CONTEXTS), help="per sequence; the first builds")
    ap.add_argument("--no-extras", action="store_true", help="leave out n_rs_seq, -kvu and the MTP draft")
    ap.add_argument("--stand-ins", action="store_true", help="give a preset without a compute model STAND_INS")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-device", action="store_true")
    ap.add_argument("--log", type=Path, help="append the log here")
    ap.add_argument("--json", type=Path, help="write the per-preset summary here")
    args = ap.parse_args()
    args.placements += [p for p in (OFFLOAD if args.offload else ()) + (MOE if args.moe else ())
                        if p not in args.placements]
    bad = set(args.placements) - set(PLACEMENTS + OFFLOAD + MOE)
    if bad:
        ap.error(f"unknown placements: {', '.join(sorted(bad))}")
    unknown = set(args.presets) - set(names)
    if unknown:
        ap.error(f"unknown presets: {', '.join(sorted(unknown))}")
    log = args.log.open("a") if args.log else None
    survey = Survey(args, log)
    survey.say(f"# survey {' '.join(sys.argv[1:])}")
    t0 = time.time()
    for name in args.presets:
        survey.summary[name] = survey.preset(name)
    total_mis = sum(len(r["mismatches"]) for r in survey.summary.values())
    total_fb = sum(len(r["fallbacks"]) for r in survey.summary.values())
    survey.say(f"# done: {len(args.presets)} presets, {total_mis} mismatches, {total_fb} fallbacks, "
               f"{time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(survey.summary, indent=1, default=dict))
    return 1 if total_mis else 0


if __name__ == "__main__":
    sys.exit(main())
