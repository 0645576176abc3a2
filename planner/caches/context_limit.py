"""How far context recommendations may go: the model's training context, or the one RoPE-scaling flags derive.

llama.cpp (0c1e57098) compares each sequence's context with ``n_ctx_train`` (the GGUF ``context_length``):
``llama_context`` logs "n_ctx_seq > n_ctx_train -- possible training context overflow", and llama-server caps each
slot at it (``n_ctx_slot()`` = min(n_ctx_seq, n_ctx_train), tools/server/server-context.cpp), so cells past it
are allocated and never used. Only YaRN moves it: ``llama_init_from_model`` sets
``n_ctx_train = n_ctx_orig_yarn / rope_freq_scale`` (uint32 of a float division) when the scaling type is yarn and
the frequency scale differs from the model's; linear scaling leaves ``n_ctx_train`` (and the server's cap) as it
was. The flags: ``--rope-scaling {none,linear,yarn}``, ``--rope-scale N`` (``rope_freq_scale = 1.0f / N``) and
``--yarn-orig-ctx N`` (``n_ctx_orig_yarn``; default the file's rope.scaling.original_context_length, else
n_ctx_train).

Three cases need more than ``n_ctx_train``:
- hybrids without RoPE (Nemotron-H, Granite-4.0-H): their converters overwrite context_length with 2**20, so
  llama.cpp neither warns nor caps; the length the model was trained at is the config's
  (``serving.max_model_len``, from max_position_embeddings), and recommendations stop there.
- pure recurrent models (Mamba, RWKV): no positional encoding and no KV cache; their state does not grow with the
  context, and the converters write a constant (2**20, "RWKV isn't context limited"). The recommendation stops at
  llama.cpp's n_ctx_train all the same, since that is where llama.cpp warns and llama-server caps each slot.
- RoPE-scaling flags on an arch that applies no RoPE change nothing and are refused.
The file's rope.scaling.* keys (``spec.rope_scaling``; llama.cpp's defaults without them: type linear, factor 1,
original context = n_ctx_train) set what the flags leave unset, as llama.cpp's ``llama_context`` does: the type
(``--rope-scaling`` unset: the file's), the frequency scale (``--rope-scale`` unset: the file's 1 / factor; type
none: 1) and YaRN's original context (``--yarn-orig-ctx`` unset: the file's). n_ctx_train is re-adjusted only
when the type is yarn and the frequency scale differs from the file's: a file that declares YaRN (Qwen3.5's
long-context recipe: yarn, factor 4, original 262,144) keeps its n_ctx_train until ``--rope-scale`` asks for
another factor; then the derived context starts from the file's original context.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from rsplan.errors import ContextError
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import MAX_CTX

#: Archs whose llama.cpp graph applies RoPE to its attention layers (ggml_rope_ext in src/models/<arch>.cpp;
#: lfm2moe builds lfm2's graph).
ROPE_ARCHS: frozenset[str] = frozenset(
    {"falcon-h1", "plamo2", "lfm2", "lfm2moe", "qwen3next", "qwen35", "qwen35moe", "minimax-01"}
)
#: Archs whose graph applies RoPE only when the file says so (granite-hybrid.cpp: ``hparams.has_rope(il)``, from
#: rope.scaling.finetuned); their converter writes context_length 2**20 exactly when there is none.
ROPE_IF_FILE_SAYS: frozenset[str] = frozenset({"granitehybrid"})
#: The context length the converters write for models without RoPE (conversion/mamba.py, rwkv.py, granite.py).
NO_ROPE_CONTEXT = 1 << 20
#: Limit kinds: the file's n_ctx_train, the config's shorter trained length, YaRN's derived length, and
#: llama.cpp's n_ctx_train for a model without positions (pure recurrent).
LIMIT_KINDS = ("n_ctx_train", "trained", "yarn", "no_position")


@dataclass(frozen=True)
class RopeFlags:
    """llama.cpp's RoPE-scaling flags as given (None: not given)."""

    scaling: str | None = None  # --rope-scaling none|linear|yarn
    scale: float | None = None  # --rope-scale N
    yarn_orig_ctx: int | None = None  # --yarn-orig-ctx N

    @property
    def given(self) -> bool:
        return self.scaling is not None or self.scale is not None or self.yarn_orig_ctx is not None

    def flags(self) -> str:
        """The flags to print with every recommendation (empty when none were given)."""
        out = []
        if self.scaling is not None:
            out.append(f"--rope-scaling {self.scaling}")
        if self.scale is not None:
            out.append(f"--rope-scale {self.scale:g}")
        if self.yarn_orig_ctx is not None:
            out.append(f"--yarn-orig-ctx {self.yarn_orig_ctx}")
        return " ".join(out)


@dataclass(frozen=True)
class ContextLimit:
    """The largest context per sequence a recommendation may use.

    Attributes:
        tokens: the limit, tokens per sequence.
        n_ctx_train: llama.cpp's n_ctx_train before any flag (the file's context_length).
        kind: one of LIMIT_KINDS.
        rope: the RoPE flags in force (printed with every recommendation).
        note: where the limit comes from, one sentence.
    """

    tokens: int
    n_ctx_train: int
    kind: str
    rope: RopeFlags
    note: str

    def describe(self) -> str:
        """Short words for a table: ``the training context (8,192, config)``."""
        words = {
            "n_ctx_train": "the training context",
            "trained": "the trained context (config)",
            "yarn": "the YaRN context",
            "no_position": "llama.cpp's n_ctx_train",
        }[self.kind]
        return f"{words} {self.tokens:,}"


def uses_rope(spec: ModelSpec) -> bool:
    """Whether llama.cpp applies RoPE for this model."""
    if spec.arch in ROPE_IF_FILE_SAYS:
        return spec.context_length != NO_ROPE_CONTEXT
    return spec.arch in ROPE_ARCHS


def _f32(x: float) -> float:
    """``x`` rounded to an IEEE float32, as llama.cpp's ``float`` holds it."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def yarn_context(n_ctx_orig: int, rope_scale: float) -> int:
    """llama.cpp's re-adjusted n_ctx_train: ``(uint32) (n_ctx_orig_yarn / rope_freq_scale)`` with
    ``rope_freq_scale = 1.0f / N`` in float32 (so ``--rope-scale 7`` on 8192 gives 57343, not 57344)."""
    freq_scale = _f32(1.0 / _f32(rope_scale))
    return int(_f32(_f32(float(n_ctx_orig)) / freq_scale))


@dataclass(frozen=True)
class FileRope:
    """The RoPE scaling llama.cpp's load_hparams takes from the file (``spec.rope_scaling``), with its defaults.

    Attributes:
        type: rope.scaling.type, ``linear`` when absent.
        factor: rope.scaling.factor, 1 when absent or 0.
        freq_scale: ``hparams.rope_freq_scale_train``: 1 / factor in float32 (1 for factor 0).
        original_context_length: rope.scaling.original_context_length, 0 when absent (n_ctx_train is used).
        declared / declared_factor: the type / the factor came from the file.
    """

    type: str
    factor: float
    freq_scale: float
    original_context_length: int
    declared: bool
    declared_factor: bool


def file_rope(spec: ModelSpec) -> FileRope:
    """llama.cpp's hparams from the file's rope.scaling.* keys (src/llama-model.cpp load_hparams)."""
    rs = spec.rope_scaling
    type_ = rs.type if rs is not None and rs.type is not None else "linear"
    factor = rs.factor if rs is not None and rs.factor else 0.0
    freq = 1.0 if factor == 0.0 else _f32(1.0 / _f32(factor))
    orig = rs.original_context_length if rs is not None and rs.original_context_length else 0
    return FileRope(type_, factor or 1.0, freq, orig, rs is not None and rs.type is not None, bool(factor))


def context_limit(spec: ModelSpec, rope: RopeFlags | None = None) -> ContextLimit:
    """The context limit for ``spec`` under the RoPE flags; a ContextError naming the limit for flags that
    cannot extend it."""
    rope = rope or RopeFlags()
    n_train = spec.context_length
    trained = spec.serving.max_model_len if spec.serving is not None else None
    if not rope.given:
        return _unscaled_limit(spec, rope, n_train, trained)
    base = trained if trained is not None and trained < n_train else n_train
    return _yarn_limit(spec, rope, n_train, base)


def _unscaled_limit(spec: ModelSpec, rope: RopeFlags, n_train: int, trained: int | None) -> ContextLimit:
    """The limit without RoPE-scaling flags (tokens): n_ctx_train, or the config's trained length where it is
    shorter (``trained``: ``serving.max_model_len``, None without a config)."""
    if spec.info.memory == "recurrent":
        config = (f"; the config's length, {trained:,} tokens, is a training-sequence length, not a limit the "
                  "state has" if trained is not None else "")
        return ContextLimit(
            n_train, n_train, "no_position", rope,
            f"{spec.arch} has no positional encoding and no KV cache: its state does not grow with the context; "
            f"{n_train:,} is llama.cpp's n_ctx_train (the converter's constant), past which llama.cpp warns and "
            f"llama-server caps each slot{config}",
        )
    if trained is not None and trained < n_train:
        return ContextLimit(
            trained, n_train, "trained", rope,
            f"trained at {trained:,} tokens (the config's context length); the file's n_ctx_train {n_train:,} "
            + ("is the converter's value for a model without RoPE, so llama.cpp would not warn past the "
               "trained length" if not uses_rope(spec) else "is longer than the config's"),
        )
    return ContextLimit(n_train, n_train, "n_ctx_train", rope,
                        f"the model's training context (n_ctx_train {n_train:,}): llama.cpp warns past it and "
                        "llama-server caps each slot at it")


def _yarn_scaling(spec: ModelSpec, rope: RopeFlags, n_train: int, base: int) -> tuple[FileRope, str]:
    """The file's RoPE hparams and the words naming where the scaling type came from ("" for the flag's), once
    the flags are checked: a positive ``--rope-scale``, an arch that applies RoPE, a scaling type of yarn
    (``base``: the tokens recommendations stop at otherwise).

    Raises:
        ContextError: flags that cannot extend the context, naming the limit that stays.
    """
    if rope.scale is not None and not (math.isfinite(rope.scale) and rope.scale > 0):
        raise ContextError(f"--rope-scale: expected a positive factor, got {rope.scale}")
    if not uses_rope(spec):
        raise ContextError(
            f"RoPE-scaling flags: {spec.arch} applies no RoPE in llama.cpp, so they cannot extend its context; "
            f"recommendations stop at {base:,} tokens per sequence"
        )
    file = file_rope(spec)
    scaling = rope.scaling or file.type
    from_file = "" if rope.scaling else f" (the file's rope.scaling.type{'' if file.declared else ', absent'})"
    label = f"--rope-scaling {scaling}" if rope.scaling else f"RoPE scaling {scaling}{from_file}"
    if scaling != "yarn":
        if rope.yarn_orig_ctx is not None:
            raise ContextError(f"--yarn-orig-ctx applies to YaRN scaling, not {label}")
        raise ContextError(
            f"{label}: llama.cpp keeps n_ctx_train {n_train:,} (only YaRN re-adjusts it) "
            f"and llama-server caps each slot there; recommendations stop at {base:,} tokens per sequence "
            "(use --rope-scaling yarn --rope-scale N to extend)"
        )
    return file, from_file


def _yarn_limit(spec: ModelSpec, rope: RopeFlags, n_train: int, base: int) -> ContextLimit:
    """The limit under RoPE-scaling flags (tokens): YaRN's re-adjusted n_ctx_train, ``n_ctx_orig_yarn /
    rope_freq_scale`` in float32 (``base``: the trained length it is compared with)."""
    file, from_file = _yarn_scaling(spec, rope, n_train, base)
    freq_scale = _f32(1.0 / _f32(rope.scale)) if rope.scale is not None else file.freq_scale
    if freq_scale == file.freq_scale:
        raise ContextError(
            f"YaRN{from_file}: give --rope-scale N, a factor other than the model's "
            f"({file.factor:g}{'' if file.declared_factor else ', the default'}); at the model's own frequency "
            f"scale llama.cpp keeps n_ctx_train {n_train:,}"
        )
    orig = rope.yarn_orig_ctx or file.original_context_length or n_train
    derived = int(_f32(_f32(float(orig)) / freq_scale))
    assert rope.scale is not None  # a frequency scale other than the file's comes from --rope-scale
    if not 1 <= derived <= MAX_CTX:
        raise ContextError(f"--rope-scale {rope.scale:g}: the YaRN context {orig:,} x {rope.scale:g} = {derived:,} "
                           f"is outside llama.cpp's uint32 n_ctx_train (1..{MAX_CTX:,})")
    return ContextLimit(
        derived, n_train, "yarn", rope,
        f"YaRN{from_file}: llama.cpp re-adjusts n_ctx_train to {_original_context_words(rope, file, orig)} / "
        f"(1 / {rope.scale:g}) = {derived:,} (float32); the model was trained at {base:,}",
    )


def _original_context_words(rope: RopeFlags, file: FileRope, orig: int) -> str:
    """Where YaRN's original context ``orig`` (tokens) comes from, in words: the flag, the file's key, or
    n_ctx_train."""
    if rope.yarn_orig_ctx:
        return f"--yarn-orig-ctx {orig:,}"
    if file.original_context_length:
        return f"the file's rope.scaling.original_context_length {orig:,}"
    return f"n_ctx_train {orig:,}, llama.cpp's default when the file has no rope.scaling.original_context_length"
