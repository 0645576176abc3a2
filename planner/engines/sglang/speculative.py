"""SGLang 0.5.23's speculative-decoding settings as its server-argument hooks resolve them, and the draft's KV.

Paths are relative to SGLang's ``sglang/srt/`` package (docs/engine-sglang.md, section 4):

- ``arg_groups/speculative_hook.py``: the EAGLE family (EAGLE, EAGLE3, NEXTN, STANDALONE; NEXTN is an alias of
  EAGLE) sets ``--max-running-requests 48`` when it is not given (:1086-1095), chooses ``(num_steps, eagle_topk,
  num_draft_tokens) = (3, 1, 4)`` when ``--speculative-num-steps`` is not given (:1160-1174, :1430-1470; it asserts
  that topk and draft tokens are not given either) and, with ``topk == 1``, sets the draft tokens to ``num_steps +
  1`` (:1255-1266). NGRAM sets the same 48 (:1294-1303), topk = ``--speculative-ngram-max-bfs-breadth`` (10) and
  12 draft tokens when none are given (:1309-1322).
- The draft's KV: ``model_runner_components/spec_aux_hidden_state.py:168-177``: the target's KV cells carry the
  draft's layers (``eagle_draft_num_layers``) only when the target config names ``num_nextn_predict_layers``
  (``configs/model_config.py:1602``) or a draft model is given (its layer count); ``model_executor/
  pool_configurator.py:259-314`` then adds ``int(cell * draft_layers / layers)`` to each cell. The draft worker
  always builds its own KV pool of the target's token count (``mem_cache/kv_cache_configurator.py:470-475``); for a
  hybrid model's own MTP draft that pool has one attention layer (:2614-2618).
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.hparams.model import ModelSpec
from rsplan.planner.engines.base import EngineError
from rsplan.planner.engines.sglang.draft_model import DraftModel

#: --speculative-algorithm values rsplan models (DFLASH, DSPARK, UNO and out-of-tree ones size other buffers).
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: The algorithms _handle_eagle_family resolves (NEXTN aliases EAGLE: speculative_hook.py:109).
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
#: max_running_requests when speculative decoding is on and none is given (speculative_hook.py:1086-1095, :1294-1303).
SPEC_MAX_RUNNING_REQUESTS = 48
#: _auto_choose_speculative_params for every arch rsplan serves: (num_steps, eagle_topk, num_draft_tokens).
AUTO_PARAMS = (3, 1, 4)
#: NGRAM: topk = --speculative-ngram-max-bfs-breadth's default, and the draft tokens when none are given.
NGRAM_TOPK = 10
NGRAM_DRAFT_TOKENS = 12
#: rsplan archs whose Hugging Face config names ``num_nextn_predict_layers``, the key SGLang reads from the target
#: (model_config.py:1602): Nemotron-H MoE. Qwen3-Next's and Qwen3.5's configs count their MTP layer under
#: ``mtp_num_hidden_layers`` instead, so SGLang adds no draft KV to their cells.
CONFIG_NAMES_NEXTN = frozenset({"nemotron_h_moe"})

MAX_RUNNING_RESET = ("Max running requests is reset to 48 for speculative decoding. You can override this by "
                     "explicitly setting --max-running-requests.")
DRAFT_TOKENS_ADJUSTED = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                         "speculative_eagle_topk == 1")
NGRAM_DEFAULT_TOKENS = ("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. You "
                        "can override this by explicitly setting --speculative-num-draft-tokens.")


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding as SGLang resolves it for one model.

    Attributes:
        algorithm: ``--speculative-algorithm`` as given (NEXTN stays NEXTN in the flags printed).
        num_steps / eagle_topk / num_draft_tokens: the resolved values (NGRAM: steps = draft tokens // topk).
        draft_kv_layers: layers whose KV SGLang adds to every target KV cell (``eagle_draft_num_layers``; 0: none).
        draft_pool_layers: attention layers of the draft worker's own KV pool (0: no draft pool, or unknown).
        printed: the flag values the answers print (key -> value; those SGLang would choose itself left out).
        log_lines: SGLang's own warnings while resolving them, verbatim.
        notes: what rsplan assumed.
    """

    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_kv_layers: int
    draft_pool_layers: int
    printed: dict[str, int | str]
    log_lines: tuple[str, ...]
    notes: tuple[str, ...]


def _eagle_params(steps: int | None, topk: int | None, tokens: int | None, log: list[str], notes: list[str]
                  ) -> tuple[int, int, int, dict[str, int | str]]:
    """_handle_eagle_family's (num_steps, eagle_topk, num_draft_tokens) and the flags to print for them."""
    if steps is None:
        if topk is not None:
            raise EngineError("SGLang asserts that --speculative-eagle-topk is not given without "
                              "--speculative-num-steps (speculative_hook.py:1160-1163): give --speculative-num-steps")
        if tokens is None:
            steps, topk, tokens = AUTO_PARAMS
            return steps, topk, tokens, {}
        # SGLang asserts here too; rsplan reads a lone --speculative-num-draft-tokens D as the linear chain of
        # D - 1 steps that SGLang would settle on, and prints those flags
        if tokens < 2:
            raise EngineError(f"--speculative-num-draft-tokens {tokens}: SGLang verifies num_steps + 1 tokens with "
                              "topk 1, at least 2")
        notes.append(f"--speculative-num-draft-tokens {tokens} alone: SGLang needs --speculative-num-steps with it; "
                     f"rsplan assumes {tokens - 1} steps of topk 1")
        steps, topk = tokens - 1, 1
    elif topk is None:
        raise EngineError("--speculative-num-steps needs --speculative-eagle-topk (SGLang compares it with 1 and "
                          "fails on an unset one)")
    if topk == 1:
        if tokens != steps + 1:  # an unset count differs too, and gets the same warning
            log.append(DRAFT_TOKENS_ADJUSTED)
        tokens = steps + 1
    elif tokens is None:
        raise EngineError(f"--speculative-eagle-topk {topk} needs --speculative-num-draft-tokens (the tree's "
                          "verified tokens)")
    return steps, topk, tokens, {"speculative_num_steps": steps, "speculative_eagle_topk": topk,
                                 "speculative_num_draft_tokens": tokens}


def resolve(spec: ModelSpec, algorithm: str | None, steps: int | None, topk: int | None, tokens: int | None,
            draft_layers: int | None, n_attention: int, draft: DraftModel | None = None) -> Speculative | None:
    """Speculative decoding for ``spec`` (None: off). ``algorithm`` None with any other speculative flag given is
    rsplan's shorthand for the model's own MTP draft (NEXTN) or, without MTP layers, EAGLE."""
    if algorithm is None:
        if steps is None and topk is None and not tokens and draft_layers is None and draft is None:
            return None
        algorithm = "NEXTN" if spec.nextn_predict_layers else "EAGLE"
    if algorithm not in ALGORITHMS:
        raise EngineError(f"--speculative-algorithm {algorithm}: rsplan models {', '.join(ALGORITHMS)}")
    log: list[str] = []
    notes: list[str] = []
    if algorithm == "NGRAM":
        if draft_layers is not None or draft is not None:
            raise EngineError("--speculative-draft-layers / --speculative-draft-model-path: NGRAM has no draft model")
        if topk is not None:
            notes.append(f"NGRAM ignores --speculative-eagle-topk {topk}: its topk is "
                         f"--speculative-ngram-max-bfs-breadth ({NGRAM_TOPK})")
        if tokens is None:
            log.append(NGRAM_DEFAULT_TOKENS)
        tokens = tokens or NGRAM_DRAFT_TOKENS
        printed: dict[str, int | str] = {"speculative_algorithm": algorithm, "speculative_num_draft_tokens": tokens}
        return Speculative(algorithm, tokens // NGRAM_TOPK, NGRAM_TOPK, tokens, 0, 0, printed, tuple(log),
                           tuple(notes))
    steps, topk, tokens, printed = _eagle_params(steps, topk, tokens or None, log, notes)
    printed = {"speculative_algorithm": algorithm, **printed}
    if draft is not None and draft_layers is not None:
        raise EngineError("--speculative-draft-layers and --speculative-draft-model-path both give the draft's layers: "
                          "give one")
    if draft is not None:
        # the draft's config: its layers ride in the target's cells and its own KV shape sizes the draft pool
        kv_layers = pool_layers = draft.layers
        notes.append(f"the draft model ({draft.layers} layer(s), {draft.kv_heads} KV heads of {draft.head_dim}) "
                     "loads its own weights beside the target's: rsplan does not size them (add them to --weights)")
    elif draft_layers is not None:
        # a draft model: its layer count rides in the target's cells (spec_aux_hidden_state.py:158-163, 174-175)
        kv_layers = pool_layers = draft_layers
        notes.append(f"the draft model's {draft_layers} layer(s) are sized as the target's attention layers (SGLang's "
                     "own assumption for the target's cells); SGLang reads them from --speculative-draft-model-path")
    elif spec.nextn_predict_layers:
        kv_layers = spec.nextn_predict_layers if spec.arch in CONFIG_NAMES_NEXTN else 0
        pool_layers = 1  # the MTP draft of a hybrid model: one attention layer (kv_cache_configurator.py:2614-2618)
        if not kv_layers:
            notes.append("the MTP draft's KV pool is allocated outside the pools' budget: the model's config names "
                         "no num_nextn_predict_layers, so SGLang reserves none of it in the target's KV cells")
    else:
        if algorithm == "NEXTN":
            raise EngineError(f"--speculative-algorithm NEXTN drafts with the model's own MTP layers; {spec.name} has "
                              "none: use EAGLE with --speculative-draft-layers N")
        # SGLang loads a draft model here (--speculative-draft-model-path) and sizes its KV from the draft's
        # layers: an unknown count is refused rather than counted as none
        raise EngineError(f"--speculative-algorithm {algorithm} drafts with a separate model whose KV SGLang sizes: "
                          "give --speculative-draft-model-path (its config.json) or --speculative-draft-layers N (its "
                          "layers; EAGLE drafts usually have 1)")
    if not n_attention:
        kv_layers = pool_layers = 0
    return Speculative(algorithm, steps, topk, tokens, kv_layers, pool_layers, printed, tuple(log), tuple(notes))
