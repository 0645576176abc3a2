"""What every llama.cpp graph shares: the reserve ubatch, the inputs, norms and the output head
(src/llama-graph.cpp ``build_inp_embd``, ``build_inp_out_ids``, ``build_rs``, ``build_norm``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor
from rsplan.planner.weights.weight_placement import OUTPUT_NORM_STEM

if TYPE_CHECKING:
    from rsplan.hparams.ggml_types import GGMLType
    from rsplan.hparams.layout import CacheLayout
    from rsplan.hparams.model import ModelSpec
    from rsplan.hparams.recurrent import RecurrentDims
    from rsplan.planner.caches.context import EffectiveContext


@dataclass(frozen=True)
class GraphParams:
    """One reserve graph: the ubatch llama_context::graph_reserve builds, and the model sizes it needs.

    Attributes:
        n_tokens: tokens of the ubatch (already a multiple of n_seqs, as graph_reserve rounds it).
        n_seqs: sequences of the ubatch (each holds n_tokens / n_seqs tokens).
        n_outputs: rows of logits the graph computes.
        n_embd / n_vocab: model width and vocabulary.
        n_layer: trunk layers.
        rs_size: recurrent cells (max(1, n_seq_max)); rs_rows: rows of each R/S tensor (rs_size * (1 + n_rs_seq)).
        n_rs_seq: rollback planes per sequence (0: none).
        spec: the model (per-arch builders read their hyper-parameters from it).
        layout: its cache layout; ctx: the resolved context (KV cells, streams, flash attention, V layout).
        embeddings: the context returns embeddings (``--embeddings``); archs that honour it build no logits.
        layers: the trunk layers to build, ascending (None: all ``n_layer``). A graph of some layers only is
            llama.cpp's with whole layers left out, each kept layer built as in the whole graph (its residual
            input the last kept layer's output): planner.compute.reuse.layer_periods leaves out repeating periods of
            layers.
    """

    n_tokens: int
    n_seqs: int
    n_outputs: int
    n_embd: int
    n_vocab: int
    n_layer: int
    rs_size: int
    rs_rows: int
    n_rs_seq: int
    spec: ModelSpec
    layout: CacheLayout
    ctx: EffectiveContext
    embeddings: bool = False
    layers: tuple[int, ...] | None = None

    @property
    def layer_ids(self) -> Sequence[int]:
        """The trunk layers the builder builds, in order (``layers``)."""
        return range(self.n_layer) if self.layers is None else self.layers

    @property
    def n_seq_tokens(self) -> int:
        return self.n_tokens // self.n_seqs


class LlamaGraph:
    """A graph under construction: ggml ops plus the llm_graph_context helpers."""

    def __init__(self, p: GraphParams) -> None:
        self.p = p
        self.b = g.GraphBuilder()
        #: The llama.cpp layer whose tensors the builder is creating now (``layer``): weights, caches and per-layer
        #: norms take it, so that the scheduler model (planner.compute.sched) knows which buffer holds each of them.
        self.current_layer: int | str | None = None

    def layer(self, il: int | str | None) -> None:
        """The builder starts layer ``il`` (a repeating layer number, ``input``, ``output``; None: none): its
        weights, caches and norms belong to it (planner.compute.sched)."""
        self.current_layer = il

    def weight(self, *ne: int, name: str = "", layer: int | str | None = None) -> Tensor:
        """A model tensor of the current layer (or of ``layer``; planner.ggml.ops.weight)."""
        return g.weight(*ne, name=name, layer=self.current_layer if layer is None else layer)

    def cache_tensor(self, type_: GGMLType, *ne: int, name: str = "") -> Tensor:
        """A KV or recurrent cache tensor of the current layer (planner.ggml.ops.cache_tensor)."""
        return g.cache_tensor(type_, *ne, name=name, layer=self.current_layer)

    def expand(self, t: Tensor) -> Tensor:
        return self.b.expand(t)

    def inp_embd(self) -> Tensor:
        """build_inp_embd: token ids -> rows of the embedding table; the unused float-embedding input is a graph
        input too, so it is allocated first and held to the end (it has no consumer that would free it)."""
        p = self.p
        tokens = g.input_tensor(g.I32, p.n_tokens, name="inp_tokens")
        embd = g.input_tensor(g.F32, p.n_embd, p.n_tokens, name="inp_embd")
        self.layer("input")
        rows = g.get_rows(self.weight(p.n_embd, p.n_vocab, name="token_embd"), tokens)
        self.layer(None)
        # ggml_build_forward_select: both alternatives are visited, then the selected one is expanded
        self.expand(rows)
        self.expand(embd)
        return rows

    def inp_pos(self, n_pos_per_embd: int = 1) -> Tensor:
        return g.input_tensor(g.I32, self.p.n_tokens * n_pos_per_embd, name="inp_pos")

    def inp_out_ids(self) -> Tensor:
        return g.input_tensor(g.I32, self.p.n_outputs, name="out_ids")

    def rs_inp(self) -> tuple[Tensor, Tensor]:
        """build_rs_inp over the full memory (reserve): s_copy of rs_size rows, main = the first n_seqs."""
        p = self.p
        s_copy = g.input_tensor(g.I32, p.rs_size, name="rs_s_copy")
        main = g.view(s_copy, (p.n_seqs,), (), 0)
        extra = g.view(s_copy, (p.rs_size - p.n_seqs,), (), p.n_seqs * s_copy.nb[0])
        return main, extra

    def rs(self, s: Tensor, state_size: int, rs: tuple[Tensor, Tensor], get_rows=None) -> Tensor:
        """build_rs: zero cell rs_z (= 0 in the reserve), gather the states, copy the extra ones."""
        p = self.p
        main, extra = rs
        states = g.reshape(s, state_size, s.ne[1])
        zero = g.view(states, (state_size,), (), 0)
        self.expand(g.scale_inplace(zero))
        out = get_rows(states, main) if get_rows else g.get_rows(states, main)
        self.expand(out)
        states_extra = g.get_rows(states, extra)
        dst = g.view(s, (state_size, p.rs_size - p.n_seqs), (s.nb[1],), p.n_seqs * s.nb[1])
        self.expand(g.cpy(states_extra, dst))
        return out

    def norm(self, cur: Tensor, width: int, name: str = "", weight_layer: int | None = None) -> Tensor:
        """build_norm, RMS with a weight (``name``: its GGUF name within the layer, e.g. ``attn_norm``, which
        ``-ot`` patterns match; ``weight_layer``: the weight is that layer's, not the current one's); inside a
        layer the RMS_NORM node is named ``norm`` with the layer's number, which llama_context::graph_get_cb may
        pin to the layer's device."""
        normed = g.rms_norm(cur)
        if isinstance(self.current_layer, int):
            normed.name, normed.layer = "norm", self.current_layer
        return g.mul(normed, self.weight(width, name=name, layer=weight_layer))

    def output(self, cur: Tensor, out_ids: Tensor | None = None, logits: bool = True,
               rows_output: bool = True, head_norm: tuple[int, str] | None = None) -> Tensor:
        """Final RMS norm and the lm head; both are graph outputs (llm_graph_result::set_outputs). With
        ``out_ids`` the normed hidden state of every token is an output too (the MTP head's input, t_h_nextn),
        and the output rows are selected after the norm. ``logits=False``: the graph ends at the norm.
        ``head_norm``: (layer, name) of a layer's own weight the final norm uses instead of the output norm (an
        MTP block's nextn.shared_head_norm); the norm itself is still built outside any layer (il = -1)."""
        p = self.p
        self.layer("output")
        if head_norm is None:
            cur = self.norm(cur, p.n_embd, OUTPUT_NORM_STEM.get(p.spec.arch, "output_norm"))
        else:
            cur = self.norm(cur, p.n_embd, head_norm[1], weight_layer=head_norm[0])
        g.GraphBuilder.set_output(cur)
        if out_ids is not None:
            cur = g.get_rows(cur, out_ids)
            if rows_output:  # t_embd; the MTP draft graph sets only t_h_nextn and t_logits
                g.GraphBuilder.set_output(cur)
        if not logits:
            self.expand(cur)
            return cur
        out = g.mul_mat(self.weight(p.n_embd, p.n_vocab, name=lm_head_name(p)), cur)
        g.GraphBuilder.set_output(out)
        self.expand(out)
        return out


def lm_head_name(p: GraphParams) -> str:
    """The lm head weight's GGUF name as ``-ot`` patterns see it: ``output``, or on a model with tied embeddings
    ``token_embd``, the name of the output layer's copy (src/llama-model-loader.cpp:1166 TENSOR_DUPLICATED: loaded
    as an output-layer tensor, matched under token_embd's name)."""
    return "token_embd" if p.spec.tie_word_embeddings else "output"


def ffn_width(p: GraphParams, il: int) -> int:
    """The FFN hidden width of layer ``il`` (feed_forward_length), which must be known for a dense FFN layer."""

    n_ff = p.spec.feed_forward(il)
    if n_ff <= 0:
        raise ComputeModelError(
            f"model '{p.spec.name}' does not give layer {il}'s feed_forward_length, which sizes its FFN; "
            "pass --compute to give the size"
        )
    return n_ff


def spec_flag(p: GraphParams, field_name: str, meaning: str) -> bool:
    """The model's boolean ``field_name`` that decides part of the graph (``meaning``: what it says and where it
    comes from), or ComputeModelError when the model does not give it."""
    value = getattr(p.spec, field_name)
    if value is None:

        raise ComputeModelError(f"model '{p.spec.name}' does not give {field_name} ({meaning}); pass --compute to "
                                "give the size")
    return bool(value)


def state_dims(p: GraphParams) -> RecurrentDims:
    """The recurrent layers' state dimensions (hparams.recurrent, derived once per model: ``p.layout.recurrent``),
    which every graph's recurrent layer reads its sizes from. A state that does not split into whole heads and
    groups has no graph here: the graphs view it per head (ComputeModelError naming why)."""
    dims = p.layout.recurrent
    if dims.split_error is not None:

        raise ComputeModelError(f"model '{p.spec.name}': {dims.split_error}, and its graph views the state per head; "
                                "pass --compute to give the size")
    return dims


def cache(lg: LlamaGraph, width: int, rows: int, name: str = "") -> Tensor:
    """A KV or recurrent cache tensor: memory of the context, not of the compute buffer."""
    return lg.cache_tensor(g.F32, width, rows, name=name)
