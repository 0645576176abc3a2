"""Which speculative-decoding setups can give a model rollback planes, and the draft lengths llama.cpp runs.

In llama.cpp (0c1e57098) n_rs_seq is not a flag of its own: ``common_params_speculative::need_n_rs_seq()``
(common/common.h) sets it to the draft length ``--spec-draft-n-max`` only for the draft types that roll back
recurrent state: mtp, eagle3, dflash and dspark. Which of them a model can use:

- ``mtp`` drafts with the model's own nextn (MTP) layers. ``llama_init_from_model`` refuses an MTP context for a
  model without them ("context type MTP requested but model doesn't contain MTP layers", src/llama-context.cpp)
  and llama-server then fails to start ("failed to create MTP context").
- ``eagle3``, ``dflash`` and ``dspark`` draft with a separate draft model (``--spec-draft-model`` / ``-md``).

The draft length is bounded by the recurrent memory's batch split: it keeps the trailing ``1 + n_rs_seq`` tokens
of each sequence in one ubatch and asserts ``n_ubatch > n_rs_seq + 1`` (``GGML_ASSERT`` in
``llama_batch_allocr::split_equal``, src/llama-batch.cpp, called from llama-memory-recurrent.cpp and the hybrid
memories), so a longer draft aborts at the first decode. ``--draft-max`` / ``--draft`` were removed from
llama.cpp's command line (common/arg.cpp: "the argument has been removed. use --spec-draft-n-max"): the flag to
print is ``--spec-draft-n-max``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.errors import ContextError
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import MAX_RS_SEQ, SPEC_TYPES_WITH_ROLLBACK

#: Draft types that need a separate draft model (``-md FILE``).
DRAFT_MODEL_TYPES: tuple[str, ...] = ("eagle3", "dflash", "dspark")
#: The draft-model type printed when the model has no MTP layers and the user named none.
DEFAULT_DRAFT_MODEL_TYPE = "eagle3"
#: The placeholder printed for the draft model's file.
DRAFT_MODEL_PLACEHOLDER = "DRAFT.gguf"
#: llama.cpp's draft-length flag (common/arg.cpp).
DRAFT_FLAG = "--spec-draft-n-max"
#: llama.cpp's names of the draft types on its command line (common/speculative.cpp
#: ``common_speculative_type_from_name_map``): ``--spec-type mtp`` is refused there, ``draft-mtp`` is the flag.
LLAMA_SPEC_TYPE_NAMES = {"mtp": "draft-mtp", "eagle3": "draft-eagle3", "dflash": "draft-dflash",
                         "dspark": "draft-dspark"}


class SpeculativeError(ContextError):
    """A speculative-decoding setup llama.cpp refuses or aborts on."""


def has_mtp(spec: ModelSpec) -> bool:
    """Whether the model has nextn (MTP) layers, which ``--spec-type mtp`` drafts with."""
    return spec.nextn_predict_layers > 0


def usable_spec_types(spec: ModelSpec) -> tuple[str, ...]:
    """The rollback draft types this model can run: mtp only with nextn layers; the draft-model types always
    (given a draft model)."""
    return (("mtp",) if has_mtp(spec) else ()) + DRAFT_MODEL_TYPES


def check_spec_type(spec: ModelSpec, spec_type: str) -> None:
    """Refuse ``--spec-type mtp`` for a model without MTP layers (llama.cpp cannot create its draft context)."""
    if spec_type == "mtp" and not has_mtp(spec):
        raise SpeculativeError(
            f"--spec-type mtp: model '{spec.name}' has no MTP (nextn) layers, so llama.cpp cannot create the MTP "
            "draft context ('model doesn't contain MTP layers'); use --spec-type eagle3, dflash or dspark with a "
            "draft model (-md FILE)"
        )


def max_draft(n_ubatch: int) -> int:
    """The longest draft (= n_rs_seq) llama.cpp decodes at an effective ``n_ubatch``: ``n_ubatch - 2`` (its
    assert ``n_ubatch > n_rs_seq + 1``), at most rsplan's MAX_RS_SEQ. Below 1 (``n_ubatch`` <= 2) no rollback
    plane is runnable."""
    return min(MAX_RS_SEQ, n_ubatch - 2)


def check_draft(n_rs_seq: int, n_ubatch: int, what: str = "--spec-draft-n-max") -> None:
    """Refuse a draft length the recurrent memory's batch split asserts on."""
    if n_rs_seq > 0 and n_rs_seq > max_draft(n_ubatch):
        raise SpeculativeError(
            f"{what} {n_rs_seq}: llama.cpp keeps the last n_rs_seq + 1 tokens of each sequence in one ubatch and "
            f"asserts n_ubatch > n_rs_seq + 1; with an effective -ub {n_ubatch} the longest draft is "
            f"{max(0, n_ubatch - 2)} (raise -ub and -b, or draft less)"
        )


@dataclass(frozen=True)
class DraftSetup:
    """How rollback planes are obtained for one model: the draft type and whether it needs a draft model.

    ``spec_type``: mtp (the model's own nextn layers) or eagle3 / dflash / dspark (a separate draft model, whose
    own weights and caches are not in rsplan's numbers).
    """

    spec_type: str

    @property
    def needs_draft_model(self) -> bool:
        return self.spec_type in DRAFT_MODEL_TYPES

    def flags(self, n_rs_seq: int, cache_types: tuple[str, str] = ("f16", "f16")) -> str:
        """The llama.cpp flags that give ``n_rs_seq`` rollback planes; with an MTP draft also its cache types
        (``cache_types``: -ctkd, -ctvd; printed when not llama.cpp's default f16)."""
        model = f" -md {DRAFT_MODEL_PLACEHOLDER}" if self.needs_draft_model else ""
        out = f"--spec-type {LLAMA_SPEC_TYPE_NAMES[self.spec_type]}{model} {DRAFT_FLAG} {n_rs_seq}"
        if self.spec_type == "mtp":
            out += "".join(f" {flag} {t}" for flag, t in zip(("-ctkd", "-ctvd"), cache_types, strict=True)
                           if t != "f16")
        return out

    def describe(self) -> str:
        """``MTP draft (the model's nextn layers)`` or ``an eagle3/dflash/dspark draft model``, for labels."""
        if self.needs_draft_model:
            article = "an" if self.spec_type[0] in "aeiou" else "a"
            return f"with {article} {self.spec_type} draft model (-md FILE; eagle3, dflash or dspark)"
        return "MTP draft (the model's own nextn layers)"


def draft_setup(spec: ModelSpec, spec_type: str | None = None) -> DraftSetup:
    """The draft setup for ``spec``: the user's ``--spec-type`` when given (mtp checked against the model),
    else mtp for a model with nextn layers, else an eagle3 draft model."""
    if spec_type is not None and spec_type != "none":
        if spec_type not in SPEC_TYPES_WITH_ROLLBACK:
            raise SpeculativeError(f"--spec-type {spec_type}: not a draft type that keeps rollback planes")
        check_spec_type(spec, spec_type)
        return DraftSetup(spec_type)
    return DraftSetup("mtp" if has_mtp(spec) else DEFAULT_DRAFT_MODEL_TYPE)
