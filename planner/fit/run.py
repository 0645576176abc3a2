"""One ``rsplan fit`` answer: read the model, lay its weights out, run planner.fit.steps, check the host.

The host check is rsplan's own (llama.cpp's --fit looks at the host only when there is no device): what stays in
host memory after the fit (weights, host caches, the host compute buffer; the weights as a started llama-server
holds them under ``--load-mode`` / repacking where the file's tensor table is known, planner.weights.host_charge), the
output buffer (host memory on every backend), and llama-server's context checkpoints at ``--ctx-checkpoints`` per
slot (planner.caches.outputs ``server_checkpoints``: recurrent models only), against the host budget.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace

from rsplan.errors import RsplanError, UnsupportedArchError
from rsplan.hparams.converter_types import tensor_type
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import read_model
from rsplan.hparams.tensor_bytes import tensor_nbytes
from rsplan.hparams.tensors import tensor_list
from rsplan.planner.backends.buffers import DEVICE_RULES
from rsplan.planner.backends.cpu_repack import Target
from rsplan.planner.backends.loader_ops import device_loader_check
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.caches.outputs import DEFAULT_CTX_CHECKPOINTS, OutputsError, output_buffer, server_checkpoints
from rsplan.planner.caches.speculative import check_draft
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.fit.draft import DraftMemory, WithDraft
from rsplan.planner.fit.memory import MemoryModel, StartFlags, StartUsage
from rsplan.planner.fit.steps import (
    DEFAULT_FIT_CTX,
    DEFAULT_MARGIN,
    UINT32_MAX,
    FitRequest,
    FitResult,
    MemoryOracle,
    fit,
)
from rsplan.planner.weights.default_weights import DEFAULT_QUANT, DEFAULT_QUANT_NOTE, weights_needed
from rsplan.planner.weights.host_charge import HostWeights, gpu_host_buffer, host_weights
from rsplan.planner.weights.host_weights import HostOptions, WeightTable
from rsplan.planner.weights.override_compact import compact_overrides
from rsplan.planner.weights.placement import MAX_DEVICES, check_tensor_split
from rsplan.planner.weights.quant_weights import SOURCE_OUTTYPE, quantized_weights
from rsplan.planner.weights.weight_placement import (
    Weight,
    gguf_weights,
    loaded,
    overrides_from_flags,
)


@dataclass(frozen=True)
class FitOptions:
    """The command's flags, parsed (sizes in bytes; ``budgets``: (where it came from, free bytes) per device)."""

    budgets: list[tuple[str, int]] | None
    device_kind: str = "CUDA"
    host_total: int = 0
    #: the host memory checked (None: not limited, as for a machine rsplan does not know)
    host_available: int | None = 0
    host_source: str = "--host-budget"
    margins: tuple[int, ...] = (DEFAULT_MARGIN,)
    fit_ctx: int = DEFAULT_FIT_CTX
    explicit_zero_ctx: bool = False
    n_gpu_layers: int | None = None
    tensor_split: tuple[float, ...] | None = None
    #: the -ot / --cpu-moe / --n-cpu-moe / --n-cpu-ffn flags in command-line order, each (flag, value): llama.cpp
    #: appends their entries to one list in that order, and the first match wins
    #: (planner.weights.weight_placement.overrides_from_flags)
    override_flags: tuple[tuple[str, str], ...] = ()
    no_kv_offload: bool = False
    compute: int | None = None
    quant: str | None = None
    tool: str = "server"
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    spec_mtp: bool = False
    host: HostOptions = field(default_factory=HostOptions)


@dataclass(frozen=True)
class HostItem:
    """One thing in host memory: ``grows`` for what is not there at start but can grow to ``bytes``."""

    what: str
    bytes: int
    grows: bool = False


@dataclass
class FitAnswer:
    """A fit and what rsplan adds to it."""

    model: str
    model_ref: str
    is_file: bool
    params: ContextParams
    device_names: list[str]
    device_sources: list[str]
    device_free: list[int]
    margins: list[int]
    result: FitResult
    host_items: list[HostItem]
    host_budget: int | None
    host_budget_source: str
    weights_source: str
    compute_exact: bool
    notes: list[str] = field(default_factory=list)
    no_kv_offload: bool = False
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    draft: StartUsage | None = None
    host: HostOptions = field(default_factory=HostOptions)
    #: the context flags as the user gave them (before --fit chose -c), and whether -c was given (0 is the
    #: model's training context, which --fit may lower only when -c is not given)
    given_params: ContextParams | None = None
    ctx_given: bool = True

    @property
    def host_bytes(self) -> int:
        """Host memory at most (checkpoints grown to their limit)."""
        return sum(i.bytes for i in self.host_items)

    @property
    def host_start_bytes(self) -> int:
        """Host memory once the server has started."""
        return sum(i.bytes for i in self.host_items if not i.grows)

    @property
    def fitted_flags(self) -> str:
        """The flags as llama-fit-params prints them: ``-c N -ngl N [-ts A,B] [-ot "..."]``."""
        return f"-c {self.result.flags.n_ctx} {self.placement_flags}"

    @property
    def placement_flags(self) -> str:
        """The layer flags of the fit as llama-fit-params prints them (``-ngl N [-ts A,B] [-ot "..."]``,
        tools/fit-params/fit-params.cpp:47 llama_max_devices); ``command_placement_flags`` are the ones to run."""
        return self._placement(runnable=False)

    @property
    def command_placement_flags(self) -> str:
        """The layer flags to start llama.cpp with. llama-fit-params drops the trailing zero parts of ``-ts`` and
        then a lone first part, so a split that gives every layer to the first device is printed as no ``-ts``,
        which llama.cpp reads as its default split by free memory over every device (src/llama-model.cpp all_zero):
        here that split stays, as ``-ts N`` (common/arg.cpp: parts not given are 0). The ``-ot`` patterns are
        shell-quoted (llama-fit-params puts them in double quotes as they are); --fit's own are merged
        (planner.weights.override_compact), one ``-ot`` each."""
        return self._placement(runnable=True)

    def _placement(self, runnable: bool) -> str:
        flags = self.result.flags
        out = f"-ngl {-1 if flags.n_gpu_layers is None else flags.n_gpu_layers}"
        if flags.tensor_split and len(self.device_names) > 1:
            parts = list(flags.tensor_split)
            while len(parts) > 1 and parts[-1] == 0:
                parts.pop()
            if len(parts) > 1 or (runnable and parts[0] != 0):
                out += " -ts " + ",".join(f"{p:g}" if runnable else str(int(p)) for p in parts)
        if flags.overrides:
            # the command carries --fit's entries merged into as few as place the same tensors (llama-fit-params
            # prints one per layer), one -ot each (llama.cpp appends every -ot's entries to one list in order,
            # common/arg.cpp:2756 parse_tensor_buffer_overrides), so that a line can break between them; entries
            # given by the user stay as given
            if runnable and self.result.changed:
                out += "".join(" -ot " + shlex.quote(o.flag_text(self.device_names))
                               for o in compact_overrides(flags.overrides))
                return out
            patterns = ",".join(o.flag_text(self.device_names) for o in flags.overrides)
            out += " -ot " + (shlex.quote(patterns) if runnable else f'"{patterns}"')
        return out


def fit_weights(read: object, spec: ModelSpec, quant: str | None, load_mtp: bool = False, ref: str = ""
             ) -> tuple[list[Weight], str, WeightTable | None]:
    """(the loaded tensors, where they come from, the file's whole tensor table with shapes when known): a GGUF's
    own tensors, else the tensor list quantized to ``quant`` (None: planner.weights.default_weights.DEFAULT_QUANT)."""
    tensors = getattr(read, "tensors", None)
    rows = getattr(read, "tensor_rows", None)
    if tensors is not None and rows is not None:
        if quant is not None:
            raise RsplanError("--quant: the model is a GGUF; its own tensors are its weights")
        shapes = getattr(read, "tensor_shapes", None)
        table = WeightTable(tensors, rows, shapes, getattr(read, "tensor_alignment", 32)) if shapes else None
        return gguf_weights(tensors, rows, spec.n_layer, load_mtp), "the GGUF's tensors", table

    default = quant is None
    quant = DEFAULT_QUANT if quant is None else quant
    try:
        qw = quantized_weights(spec, quant)
    except UnsupportedArchError as exc:
        if default:  # fit places the weights tensor by tensor: it needs a tensor list, a size alone will not do
            raise weights_needed(ref, str(exc), "give a GGUF file (--quant sizes the same tensor list)") from None
        raise RsplanError(f"--quant {quant}: {exc}") from None
    weights = [Weight(t.name, t.n_bytes, t.type, t.ne[0]) for t in qw.plan.tensors
               if loaded(t.name, spec.n_layer, load_mtp)]
    source = f"llama-quantize {qw.ftype} of the converter's {SOURCE_OUTTYPE} GGUF"
    return weights, source + (f", {DEFAULT_QUANT_NOTE}" if default else ""), qw.weight_table


def _user_split(parts: tuple[float, ...] | None, n_devices: int) -> tuple[float, ...] | None:
    """``-ts`` as --fit sees it: no part other than zero (``-ts 0,0``, ``-ts ""``) is llama.cpp's default split by
    free memory (src/llama-model.cpp:1557 all_zero) and does not stop --fit from choosing one
    (common/fit.cpp:470 tensor_split aborts on a non-zero part only): None. Else the parts, checked and padded
    (planner.weights.placement)."""
    if parts is None or not any(parts):
        return None
    return tuple(check_tensor_split(list(parts), max(n_devices, 1)))


def converter_weights(spec: ModelSpec, outtype: str = "bf16", load_mtp: bool = False) -> list[Weight]:
    """The loaded tensors of the GGUF ``convert_hf_to_gguf.py --outtype OUTTYPE`` writes (hparams.tensors); the
    MTP layers' too with ``load_mtp``."""

    out = []
    for t in tensor_list(spec):
        type_ = tensor_type(t, outtype)
        if t.loaded or load_mtp:
            out.append(Weight(t.name, tensor_nbytes(t, type_), type_, t.shape[0]))
    return out


def run_fit(model_ref: str, params: ContextParams, opts: FitOptions) -> FitAnswer:
    """``rsplan fit``: read the model and its weights, then ``fit_model``."""

    read = read_model(model_ref)
    weights, weights_source, table = fit_weights(read, read.spec, opts.quant, opts.spec_mtp, model_ref)
    return fit_model(read.spec, weights, params, opts, model_ref=model_ref, is_file=read.kind == "gguf",
                     weights_source=weights_source, table=table)


def dry_run_repack(device_kind: str | None, host: HostOptions) -> Target | None:
    """The repack target of the host weights in --fit's dry run: ``host.repack`` where their buffer list starts
    with CPU_REPACK (no devices' host buffer type: a CPU-only or RPC start, or ``--no-host``; src/llama-model.cpp:1078
    make_cpu_buft_list), else None. The dry run never maps the file, so it is the list, not the mapping, that
    decides (planner.weights.weight_placement.place_weights: the tied output's second copy)."""
    if gpu_host_buffer(device_kind) is not None and not host.no_host:
        return None
    return host.repack if host.repack.repacks else None


def fit_model(spec: ModelSpec, weights: list[Weight], params: ContextParams, opts: FitOptions, *,
              model_ref: str = "", is_file: bool = False, weights_source: str = "",
              table: WeightTable | None = None, session: SizingSession | None = None) -> FitAnswer:
    """The fit of ``spec`` with ``weights`` (the loaded tensors) and the host check (module docstring); ``table``:
    the file's whole tensor table, when known: the host check then counts the host weights as a started
    llama-server holds them under ``opts.host`` (planner.weights.host_charge). ``session``: the sizing session
    whose graphs serve the fit's many sizings (planner.compute.reuse.session; None: a new one)."""
    layout = cache_layout(spec)
    if opts.spec_mtp:
        # a draft past the batch split's bound aborts llama-server whatever --fit chooses (as estimate and capacity)
        check_draft(params.n_rs_seq, resolve_context(layout, params).n_ubatch)
    budgets = opts.budgets or []
    if len(budgets) > MAX_DEVICES:
        raise RsplanError(f"--budget: {len(budgets)} devices; llama.cpp handles at most {MAX_DEVICES}")
    names = [f"{opts.device_kind}{i}" for i in range(len(budgets))]
    margins = _fit_margins(opts.margins, len(budgets))
    user = StartFlags(n_ctx=params.n_ctx, n_gpu_layers=opts.n_gpu_layers,
                      tensor_split=_user_split(opts.tensor_split, len(budgets)),
                      overrides=overrides_from_flags(opts.override_flags, names))
    model = MemoryModel(spec, layout, weights, params, tuple(b for _, b in budgets), DEVICE_RULES[opts.device_kind],
                        compute_override=opts.compute, offload_kqv=not opts.no_kv_offload, tool=opts.tool,
                        device_kind=opts.device_kind, n_draft=params.n_rs_seq if opts.spec_mtp else 0,
                        host_repack=dry_run_repack(opts.device_kind if budgets else None, opts.host), keep_from=2,
                        session=session if session is not None else SizingSession())
    oracle: MemoryOracle = model
    draft = None
    if opts.spec_mtp:
        draft = DraftMemory(model, user, compute_override=opts.compute)
        oracle = WithDraft(model, draft)
    req = FitRequest(user, UINT32_MAX if opts.explicit_zero_ctx else opts.fit_ctx, tuple(margins), opts.host_total)
    # llama.cpp's hp_ngl: the trunk's layers, and the MTP layers when they are loaded
    n_layer = spec.n_layer + (spec.nextn_predict_layers if opts.spec_mtp else 0)
    result = fit(oracle, req, n_seq_max=params.n_seq_max, kv_unified=params.kv_unified, n_layer=n_layer,
                 n_ctx_train=spec.context_length, n_expert=spec.expert_count or 0)
    if opts.spec_mtp and not result.failure and result.flags.n_ctx != params.n_ctx:
        # a smaller context caps n_batch, and with it the ubatch the draft must fit in
        fitted = resolve_context(layout, replace(params, n_ctx=result.flags.n_ctx))
        check_draft(params.n_rs_seq, fitted.n_ubatch, f"at the -c {result.flags.n_ctx} --fit chooses, "
                                                      "--spec-draft-n-max")
    answer = FitAnswer(spec.name, model_ref, is_file, replace(params, n_ctx=result.flags.n_ctx), names,
                       [s for s, _ in budgets], [b for _, b in budgets], margins, result, [], opts.host_available,
                       opts.host_source, weights_source,
                       opts.compute is not None or not budgets or model.compute_estimate is None,
                       no_kv_offload=opts.no_kv_offload, ctx_checkpoints=opts.ctx_checkpoints,
                       draft=draft.measure(result.flags.n_ctx) if draft else None, host=opts.host,
                       given_params=params, ctx_given=opts.explicit_zero_ctx or params.n_ctx != 0)
    answer.notes.extend(_fit_notes(model, result, opts, has_budgets=bool(budgets)))
    held = _held_host_weights(spec, table, weights, model, result, opts, has_budgets=bool(budgets))
    _host_check(answer, spec, layout, opts.ctx_checkpoints, held)
    if draft is not None:
        _draft_host(answer, spec, layout, opts.ctx_checkpoints, draft)
    return answer


def _fit_margins(margins: tuple[int, ...], n_devices: int) -> list[int]:
    """The ``--fit-target`` margin of each device (bytes): one value for all, or one each.

    Raises:
        RsplanError: another count of values.
    """
    out = list(margins)
    if len(out) == 1:
        return out * max(n_devices, 1)
    if len(out) != n_devices:
        raise RsplanError(f"--fit-target: {len(out)} values for {n_devices} devices (give one, or one each)")
    return out


def _fit_notes(model: MemoryModel, result: FitResult, opts: FitOptions, *, has_budgets: bool) -> list[str]:
    """What the answer says about the fit itself: wrapped layer counts, estimated compute buffers, the ops a
    device leaves to the host (``has_budgets``: devices were given)."""
    notes: list[str] = []
    if result.wrapped:
        notes.append("llama.cpp's --fit measured plans whose per-device layer counts wrapped around "
                     "(uint32_t arithmetic in common/fit.cpp's step 4: a partial layer taken from a device "
                     "that holds only the output layer); the choice above is what llama.cpp makes of them, "
                     "and may leave devices empty or layers split oddly: check it, or give -ngl and -ts "
                     "yourself")
    if has_budgets and opts.compute is None and model.compute_estimate is not None:
        notes.append(f"per-device compute buffers are an estimate: {model.compute_estimate}")
    host_ops = model.host_ops_note(result.flags) if has_budgets and opts.compute is None else None
    if host_ops is not None:
        notes.append(host_ops)
    return notes


def _held_host_weights(spec: ModelSpec, table: WeightTable | None, weights: list[Weight], model: MemoryModel,
                       result: FitResult, opts: FitOptions, *, has_budgets: bool) -> HostWeights | None:
    """The host weights a started llama-server holds under the chosen flags, where the file's whole tensor table
    is known (``table``), else None (``has_budgets``: devices were given, else everything is on the host)."""
    if table is None:
        return None
    kind = opts.device_kind if has_budgets else None
    return host_weights(table, weights, model.placement(result.flags), opts.host, gpu_host_buffer(kind),
                        result.flags.overrides, arch=spec.arch, loader=device_loader_check(kind, spec))


def _host_check(answer: FitAnswer, spec: ModelSpec, layout: CacheLayout, n_ctx_checkpoints: int,
                held: HostWeights | None = None) -> None:
    """The host items of a start: the weights as a started llama-server holds them (``held``; None: as the dry run
    reads them), host caches and compute, the output buffer, the checkpoints at their limit."""
    host = answer.result.usage.host
    weights = HostItem("weights on the host", host.model)
    if held is not None:
        weights = HostItem(f"weights on the host ({held.describe()})", held.total)
        answer.notes.append(f"host check: the weights as a started llama-server holds them under "
                            f"{held.options.describe()}; the fit measures llama.cpp's --fit dry run (weights read "
                            f"into buffers: {host.model:,} B on the host)")
    answer.host_items += [weights, HostItem("caches on the host", host.context),
                          HostItem("host compute buffer", host.compute)]
    params = answer.params
    try:
        out = output_buffer(spec, params)
        answer.host_items.append(HostItem("output buffer", out.bytes))
    except OutputsError as exc:
        answer.notes.append(f"output buffer not counted: {exc}")
    cps = server_checkpoints(layout, resolve_context(layout, params), n_ctx_checkpoints, swa_full=params.swa_full)
    if cps.note is None:
        answer.host_items.append(HostItem(
            f"llama-server checkpoints ({cps.per_slot} per slot x {cps.n_slots}, "
            f"{cps.per_checkpoint_bytes:,} bytes each)", cps.bytes, grows=True))
    else:
        answer.notes.append(f"llama-server context checkpoints: {cps.note}")


def _draft_host(answer: FitAnswer, spec: ModelSpec, layout: CacheLayout, n_ctx_checkpoints: int,
                draft: DraftMemory) -> None:
    """The MTP draft context's host memory beside the breakdown: its own output buffer (n_seq_max rows of logits,
    llama_context::output_reserve), and its part of llama-server's checkpoints (each also holds the draft's KV
    cells of its sequence: planner.caches.outputs.mtp_draft_checkpoint_bytes, at most a slot's n_ctx_seq of them), at
    the context the started server gives the draft (the target's, resolved)."""
    params = answer.params
    ctx = resolve_context(layout, params)
    try:
        out = output_buffer(spec, draft.params(ctx.n_ctx))
        answer.host_items.append(HostItem("MTP draft output buffer", out.bytes))
    except OutputsError as exc:
        answer.notes.append(f"MTP draft output buffer not counted: {exc}")
    cps = server_checkpoints(layout, ctx, n_ctx_checkpoints, swa_full=params.swa_full)
    cps = cps.with_mtp_draft(spec, params, ctx, layout)
    if cps.draft_per_checkpoint_bytes:
        answer.host_items.append(HostItem(
            f"MTP draft's part of the checkpoints ({cps.per_slot} per slot x {cps.n_slots}, up to "
            f"{cps.draft_per_checkpoint_bytes:,} bytes each: its KV cells of the sequence)",
            cps.draft_per_checkpoint_bytes * cps.per_slot * cps.n_slots, grows=True))
