"""The llama.cpp flags that run an answer: context, parallel sequences, cache types, rollback planes and draft,
layer placement and host-weight flags, in llama-server's spelling (common/arg.cpp)."""

from __future__ import annotations

from collections.abc import Sequence

from rsplan.planner.caches.context import (
    ContextParams,
)
from rsplan.planner.caches.context_limit import RopeFlags
from rsplan.planner.caches.outputs import DEFAULT_CTX_CHECKPOINTS
from rsplan.planner.caches.speculative import DraftSetup
from rsplan.planner.capacity.limits import MIB
from rsplan.planner.weights.host_weights import HostOptions
from rsplan.planner.weights.placement import Placement
from rsplan.planner.weights.weight_placement import override_flags_text


def mib_text(n_bytes: int) -> str:
    return f"{n_bytes / MIB:,.2f} MiB"


def llama_flags(
    params: ContextParams,
    placement: Placement | None = None,
    *,
    draft: DraftSetup | None = None,
    tensor_split: Sequence[float] | None = None,
    rope: RopeFlags | None = None,
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS,
    host: HostOptions | None = None,
    override_flags: Sequence[tuple[str, str]] = (),
) -> str:
    """The llama.cpp command-line flags that reproduce ``params`` (and the layer placement, and ``host``'s load
    mode and repacking: ``HostOptions.flags``).

    Flags that only rsplan knows (``--type-r`` / ``--type-s``: llama.cpp always uses f32) are not printed.
    n_rs_seq has no llama.cpp flag of its own: it is the draft length of MTP/EAGLE3/DFLASH/DSPARK speculative
    decoding, printed as ``--spec-type TYPE [-md DRAFT.gguf] --spec-draft-n-max N`` (``draft``; default mtp).
    RoPE-scaling flags (``rope``) are printed as given; ``--ctx-checkpoints N`` when not llama-server's default.
    """
    out = [f"-c {params.n_ctx}", f"-np {params.n_seq_max}"]
    if params.kv_unified:
        out.append("-kvu")
    if params.type_k != "f16":
        out.append(f"-ctk {params.type_k}")
    if params.type_v != "f16":
        out.append(f"-ctv {params.type_v}")
    if params.flash_attn != "auto":
        out.append(f"-fa {params.flash_attn}")
    if params.swa_full:
        out.append("--swa-full")
    if params.n_batch != 2048:
        out.append(f"-b {params.n_batch}")
    if params.n_ubatch != 512:
        out.append(f"-ub {params.n_ubatch}")
    if params.n_rs_seq > 0:
        out.append((draft or DraftSetup("mtp")).flags(params.n_rs_seq, (params.draft_type_k, params.draft_type_v)))
    if rope is not None and rope.given:
        out.append(rope.flags())
    if ctx_checkpoints != DEFAULT_CTX_CHECKPOINTS:
        out.append(f"--ctx-checkpoints {ctx_checkpoints}")
    if placement is not None:
        out += _placement_flags(placement, tensor_split)
    if override_flags:
        out.append(override_flags_text(override_flags))
    if host is not None:
        out.extend(host.flags())
    return " ".join(out)


def _placement_flags(placement: Placement, tensor_split: Sequence[float] | None) -> list[str]:
    """``-ngl``, ``-ts`` (several devices) and ``-nkvo`` of ``placement``."""
    n_units = placement.n_layer_all + 1
    out = ["-ngl all" if placement.n_gpu_layers >= n_units else f"-ngl {placement.n_gpu_layers}"]
    if placement.n_devices > 1 and tensor_split is not None:
        out.append("-ts " + ",".join(f"{p:g}" for p in tensor_split))
    if not placement.offload_kqv:
        out.append("-nkvo")
    return out
