"""The order Vulkan's ``graph_optimize`` leaves a split's nodes in, and the allocation dependencies it adds
(ggml/src/ggml-vulkan/ggml-vulkan.cpp:14663 ggml_vk_graph_optimize, llama.cpp 0c1e57098).

``ggml_backend_sched_split_graph`` hands each split, as a view of the graph's nodes, to its backend's
``graph_optimize`` (ggml/src/ggml-backend.cpp:1478 ggml_backend_graph_optimize) before the graph copy that ggml-alloc
lays out. Vulkan's reorders the split so that nodes which do not depend on each other run together (fewer
barriers): which tensors are live at once, hence the compute buffer, follows the new order. It is on for every
Vulkan device unless ``GGML_VK_DISABLE_GRAPH_OPTIMIZE`` is set (ggml/src/ggml-vulkan/ggml-vulkan.cpp:4022
GGML_VK_DISABLE_GRAPH_OPTIMIZE); no device property or node count turns it off.

The pass, step by step: from the first node not yet placed (``first``),

- a fusion run starting at ``first`` (the top-k MoE routers, snake, top-k QSA, RMS_NORM + MUL + ADD (+ MUL), RMS_NORM
  (+ MUL + ROPE) + VIEW + SET_ROWS, ROPE + VIEW + SET_ROWS, the hc_post gate: ops only, in the order of the source)
  is placed whole; the top-k routers and the hc_post gate also keep every tensor they read from outside the run
  until their last node (a SCALE right after a router counts as its last node):
  ggml/src/ggml-vulkan/ggml-vulkan.cpp:14750 add_pattern_alloc_deps, reported through ``params->add_alloc_dep`` as
  CUDA's are (planner.backends.cuda_fusion), but on the ops alone (no ggml_can_fuse check, unlike CUDA's);
- else ``first`` opens a set, and each later non-view node of the next NUM_TO_CHECK (20) that starts no fusion run and
  reads no node left behind joins it (ggml/src/ggml-vulkan/ggml-vulkan.cpp:14676 is_src_of: a source, a view of the
  same memory, or a write over memory a view still reads), except that a node may read the set's last node in
  the pairs Vulkan fuses (RMS_NORM or UNARY then MUL with only views or placed nodes between; MUL_MAT + ADD,
  MUL_MAT_ID + ADD_ID or MUL, ADD + ADD, SSM_CONV + ADD or UNARY next to each other); a node that joins pulls its
  fusion partners after it from the 14 nodes after it (the ROPE reading an RMS_NORM + MUL, the VIEW + SET_ROWS storing a
  ROPE or RMS_NORM, the MUL after MUL_MAT_ID + ADD_ID, the ADD after MUL_MAT + ADD, the UNARY after SSM_CONV +
  ADD, the MUL over a UNARY);
- then, unless the set ends with an ADD, the views of the next 20 whose sources are placed or in the set join it.

The set is placed in the order it was gathered, and the pass goes on from the first node left.

Assumed: every node is flagged to compute (ggml_build_forward_expand's; only the token / embedding input select of
llm_graph_context::build_inp_embd is not); every UNARY is of a kind with a fused MUL kernel (gelu, sigmoid, silu,
softplus: ggml/src/ggml-vulkan/ggml-vulkan.cpp:9953 ggml_vk_unary_mul_op_index), as rsplan's tensors do not carry the
unary kind (``fused_unary`` tells otherwise; MiniMax's exp decays are the graphs' other kind before a MUL).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from itertools import chain

from rsplan.planner.ggml.alloc import Tensor
from rsplan.planner.ggml.fusion import can_fuse_subgraph

#: ggml/src/ggml-vulkan/ggml-vulkan-types.h:506 topk_moe_early_softmax_norm and the other top-k MoE routers, in the
#: order graph_optimize tries them; each keeps its external inputs until its last node.
TOPK_MOE_PATTERNS: tuple[tuple[str, ...], ...] = (
    ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"),
    ("UNARY", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"),
    ("UNARY", "SQRT", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV",
     "RESHAPE"),
    ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS"),
    ("ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SOFT_MAX", "RESHAPE"),
)
#: ggml/src/ggml-vulkan/ggml-vulkan-types.h:530 snake_pattern.
SNAKE = ("MUL", "SIN", "SQR", "MUL", "ADD")
#: ggml/src/ggml-vulkan/ggml-vulkan-types.h:534 topk_qsa_pattern.
TOPK_QSA = ("GET_ROWS", "PERMUTE", "CONT", "CPY", "RESHAPE", "ADD", "TOP_K")
#: The runs placed whole without dependencies, in the order graph_optimize tries them (snake, top-k QSA, then
#: ggml/src/ggml-vulkan/ggml-vulkan-types.h:548 rms_norm_mul_add_mul_pattern and the RMS_NORM / ROPE stores).
KEPT_PATTERNS: tuple[tuple[str, ...], ...] = (
    SNAKE, TOPK_QSA,
    ("RMS_NORM", "MUL", "ADD", "MUL"),
    ("RMS_NORM", "MUL", "ADD"),
    ("RMS_NORM", "MUL", "ROPE", "VIEW", "SET_ROWS"),
    ("RMS_NORM", "VIEW", "SET_ROWS"),
    ("ROPE", "VIEW", "SET_ROWS"),
)
#: ggml/src/ggml-vulkan/ggml-vulkan-types.h:559 hc_post_gate_pattern: tried last, keeps its inputs like a router.
HC_POST_GATE = ("SCALE", "UNARY", "SCALE", "DSV4_HC_POST")
#: The runs a node may start that keep it out of a set (besides the top-k QSA run, whose every node is kept out).
STARTS_SKIPPED = (*TOPK_MOE_PATTERNS, SNAKE, *KEPT_PATTERNS[2:], HC_POST_GATE)
#: The ops graph_optimize treats as computing nothing (its own is_empty: the op alone, not ggml_is_empty).
EMPTY_OPS = frozenset({"NONE", "RESHAPE", "TRANSPOSE", "VIEW", "PERMUTE"})
#: (set's last node, node) pairs that may depend on each other where only views or placed nodes lie between.
NEAR_FUSIONS = frozenset({("RMS_NORM", "MUL"), ("UNARY", "MUL")})
#: (set's last node, node) pairs that may depend on each other where the node comes right after.
NEXT_FUSIONS = frozenset({("MUL_MAT", "ADD"), ("MUL_MAT_ID", "ADD_ID"), ("MUL_MAT_ID", "MUL"), ("ADD", "ADD"),
                          ("SSM_CONV", "ADD"), ("SSM_CONV", "UNARY")})
#: ggml/src/ggml-vulkan/ggml-vulkan.cpp:14833 NUM_TO_CHECK: the nodes from ``first`` a set is gathered from.
NUM_TO_CHECK = 20
#: How far after a node its fusion partners are looked for (``std::min(j + 15, n_nodes)``).
PARTNER_LOOKAHEAD = 15
#: GGML_MAX_SRC.
MAX_SRC = 10


def vulkan_graph_reorder(nodes: Sequence[Tensor], uses: Counter[Tensor] | None = None,
                         deps: dict[Tensor, list[Tensor]] | None = None, *,
                         fused_unary: Callable[[Tensor], bool] | None = None) -> list[Tensor]:
    """The split ``nodes`` (in graph order) in the order ggml_vk_graph_optimize leaves them: a permutation.

    ``uses``: cgraph->use_counts of the whole graph (how many source slots name each tensor, counted before the
    scheduler points sources at input copies: planner.backends.cuda_fusion.use_counts); None: counted over
    ``nodes``, right where they are the whole graph. ``deps``: where given, the allocation dependencies the pass adds
    are put in it (``until`` node -> the tensors kept until it has run, in the order added, each once), as
    planner.backends.cuda_fusion.alloc_deps does. ``fused_unary``: whether a UNARY node is of a kind Vulkan fuses
    with a MUL (None: every one)."""
    counts = uses if uses is not None else Counter(chain.from_iterable(n.src for n in nodes))
    run = _Reorder(list(nodes), counts, {} if deps is None else deps, fused_unary or (lambda _: True))
    return run.run()


def vulkan_alloc_deps(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor],
                      deps: dict[Tensor, list[Tensor]] | None = None) -> dict[Tensor, list[Tensor]]:
    """graph_optimize's dependencies over the split ``nodes[start:end]`` of the whole graph ``nodes``, added to
    ``deps`` (a new dict where None) and returned: planner.backends.cuda_fusion.alloc_deps's contract. Every
    ``until`` node lies inside the split."""
    deps = {} if deps is None else deps
    vulkan_graph_reorder(nodes[start:end], uses, deps)
    return deps


def is_empty(node: Tensor) -> bool:
    """graph_optimize's is_empty: a node of a view op (or NONE), which computes nothing."""
    return node.op in EMPTY_OPS


def _src(node: Tensor, s: int) -> Tensor | None:
    """node->src[s] (None past the sources given)."""
    return node.src[s] if s < len(node.src) else None


def _base(t: Tensor) -> Tensor:
    """The tensor owning ``t``'s memory: its view source, or itself."""
    return t.view_src if t.view_src is not None else t


def is_src_of(dst: Tensor, src: Tensor) -> bool:
    """ggml/src/ggml-vulkan/ggml-vulkan.cpp:14676 is_src_of: ``dst`` must run after ``src``. ``src`` is a source of
    ``dst``; or, both computing: a source of ``dst`` shares ``src``'s memory, or ``dst`` writes memory a source of
    ``src`` reads; or ``dst`` and ``src`` share memory (views of one tensor)."""
    if any(d is src for d in dst.src):
        return True
    if not (is_empty(dst) or is_empty(src)):
        base_src, base_dst = _base(src), _base(dst)
        if any(_base(d) is base_src for d in dst.src) or any(_base(r) is base_dst for r in src.src):
            return True
    return _base(dst) is _base(src)


def _keep_dep(deps: dict[Tensor, list[Tensor]], tensor: Tensor, until: Tensor) -> None:
    """ggml/src/ggml-backend.cpp:1464 add_alloc_dep: ``tensor`` kept until ``until``, listed once."""
    keep = deps.setdefault(until, [])
    if tensor not in keep:
        keep.append(tensor)


def _can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """ggml/src/ggml.c:1589 ggml_can_repeat: ``t0`` broadcasts over ``t1`` (an empty one only onto an empty one)."""
    if 0 in t0.ne:
        return 0 in t1.ne
    return all(b % a == 0 for a, b in zip(t0.ne, t1.ne, strict=True))


def _is_contiguous_1(t: Tensor) -> bool:
    """ggml/src/ggml.c:1502 ggml_is_contiguous_1: rows packed and dims 2, 3 packed over the rows (dim 1 free)."""
    next_nb = t.type.type_size
    if t.ne[0] != t.type.block_size and t.nb[0] != next_nb:
        return False
    next_nb *= t.ne[0] // t.type.block_size
    next_nb = t.ne[1] * t.nb[1]
    for i in (2, 3):
        if t.ne[i] != 1 and t.nb[i] != next_nb:
            return False
        next_nb *= t.ne[i]
    return True


def can_fuse_unary_mul(unary: Tensor, mul: Tensor, fused_unary: Callable[[Tensor], bool]) -> bool:
    """ggml/src/ggml-vulkan/ggml-vulkan.cpp:13422 ggml_vk_can_fuse_unary_mul: a fused kind, f32 or f16 throughout,
    the MUL's other source and the unary's source contiguous in rows, and the smaller side tiling the larger."""
    if not fused_unary(unary) or unary.type.name not in ("f32", "f16") or unary.type != mul.type:
        return False
    a, b = _src(mul, 0), _src(mul, 1)
    if a is not unary and b is not unary:
        return False
    other = b if a is unary else a
    if other is None or other.type != unary.type:
        return False
    if not _is_contiguous_1(other) or not _is_contiguous_1(unary.src[0]):
        return False
    return _can_repeat(other, unary) if a is unary else a is not None and _can_repeat(unary, a)


class _Reorder:
    """One run of ggml_vk_graph_optimize over a split: ``nodes`` in graph order, ``used`` (placed, or pulled into
    the set being gathered), ``placed`` (used_node_set: nodes placed by an earlier set or run), ``order`` (the
    new order so far) and ``first`` (first_unused: the first node not used)."""

    def __init__(self, nodes: list[Tensor], uses: Counter[Tensor], deps: dict[Tensor, list[Tensor]],
                 fused_unary: Callable[[Tensor], bool]) -> None:
        self.nodes = nodes
        self.n = len(nodes)
        self.uses = uses
        self.deps = deps
        self.fused_unary = fused_unary
        self.used = [False] * self.n
        self.placed: set[Tensor] = set()
        self.order: list[Tensor] = []
        self.first = 0

    def run(self) -> list[Tensor]:
        """The whole pass: a fusion run at ``first`` placed whole, else a set gathered from ``first`` (real nodes,
        then views unless the set ends with an ADD) and placed in the order gathered."""
        while self.first < self.n:
            if self._keep_fusion_run():
                continue
            current = [self.first]
            self._gather_real_nodes(current)
            if self.nodes[current[-1]].op != "ADD":
                self._gather_views(current)
            self._place(current)
        return self.order

    def _place(self, idxs: Sequence[int]) -> None:
        """Append ``idxs`` to the new order, mark them used and placed, and move ``first`` past the used nodes."""
        for i in idxs:
            self.order.append(self.nodes[i])
            self.placed.add(self.nodes[i])
            self.used[i] = True
        while self.first < self.n and self.used[self.first]:
            self.first += 1

    def _match(self, pattern: Sequence[str], start: int) -> bool:
        """match_pattern: ``nodes[start:]`` has ``pattern``'s ops, none of them used."""
        if start + len(pattern) > self.n or self.nodes[start].op != pattern[0]:
            return False
        return all(self.nodes[start + k].op == op and not self.used[start + k] for k, op in enumerate(pattern))

    def _keep_fusion_run(self) -> bool:
        """The fusion runs tried at ``first`` in the source's order (ggml/src/ggml-vulkan/ggml-vulkan.cpp:14765
        keep_topk_moe_pattern first): the first that matches is placed whole, the routers and the hc_post gate
        keeping their inputs."""
        for pattern in TOPK_MOE_PATTERNS:
            if self._match(pattern, self.first):
                last = self.first + len(pattern) - 1
                if last + 1 < self.n and self.nodes[last + 1].op == "SCALE":  # a router's fused weight scale
                    last += 1
                self._keep_inputs(pattern, last)
                self._place(range(self.first, self.first + len(pattern)))
                return True
        for pattern in (*KEPT_PATTERNS, HC_POST_GATE):
            if self._match(pattern, self.first):
                if pattern is HC_POST_GATE:
                    self._keep_inputs(pattern, self.first + len(pattern) - 1)
                self._place(range(self.first, self.first + len(pattern)))
                return True
        return False

    def _keep_inputs(self, pattern: Sequence[str], last: int) -> None:
        """ggml/src/ggml-vulkan/ggml-vulkan.cpp:14750 add_pattern_alloc_deps: every source of the run's nodes not
        made inside it before, kept until ``nodes[last]``."""
        seen: set[Tensor] = set()
        for node in self.nodes[self.first:self.first + len(pattern)]:
            for src in node.src:
                if src not in seen:
                    seen.add(src)
                    _keep_dep(self.deps, src, self.nodes[last])
            seen.add(node)

    def _starts_fusion_run(self, j: int) -> bool:
        """A run the gathering leaves to be placed whole starts at ``j``, or ``j`` lies inside a top-k QSA run."""
        if any(self._match(pattern, j) for pattern in STARTS_SKIPPED):
            return True
        return any(j - o >= 0 and self._match(TOPK_QSA, j - o) for o in range(len(TOPK_QSA)))

    def _gather_real_nodes(self, current: list[int]) -> None:
        """The first pass: each computing node of the next NUM_TO_CHECK that may join the set, then its fusion
        partners (ggml/src/ggml-vulkan/ggml-vulkan.cpp:14866 ok)."""
        for j in range(self.first + 1, min(self.first + NUM_TO_CHECK, self.n)):
            if self.used[j] or is_empty(self.nodes[j]) or self._starts_fusion_run(j):
                continue
            if self._may_join(j, current):
                current.append(j)
                self._pull_partners(j, current)

    def _may_join(self, j: int, current: list[int]) -> bool:
        """``nodes[j]`` reads no node left behind, but for a fused pair with the set's last node."""
        for c in range(self.first, j):
            if self.used[c] or not is_src_of(self.nodes[j], self.nodes[c]):
                continue
            if c == current[-1] and self._fused_pair(c, j):
                continue
            return False
        return True

    def _fused_pair(self, c: int, j: int) -> bool:
        """``nodes[c]`` then ``nodes[j]`` is a pair Vulkan fuses: next to each other, or (RMS_NORM or UNARY then
        MUL) with only views or used nodes between (empty_or_scheduled_between)."""
        pair = (self.nodes[c].op, self.nodes[j].op)
        if pair in NEAR_FUSIONS and all(self.used[v] or is_empty(self.nodes[v]) for v in range(c + 1, j)):
            return True
        return j == c + 1 and pair in NEXT_FUSIONS

    def _gather_views(self, current: list[int]) -> None:
        """The second pass: each view of the next NUM_TO_CHECK whose sources are used or in the set."""
        for j in range(self.first + 1, min(self.first + NUM_TO_CHECK, self.n)):
            if self.used[j] or not is_empty(self.nodes[j]):
                continue
            if all(self.used[c] or c in current or not is_src_of(self.nodes[j], self.nodes[c])
                   for c in range(self.first, j)):
                current.append(j)

    def _pull(self, k: int, current: list[int]) -> None:
        """``nodes[k]`` joins the set now (marked used, placed with the set)."""
        current.append(k)
        self.used[k] = True

    def _ahead(self, j: int) -> range:
        """The nodes a partner of ``nodes[j]`` is looked for in: the next PARTNER_LOOKAHEAD - 1."""
        return range(j + 1, min(j + PARTNER_LOOKAHEAD, self.n))

    def _ready(self, t: Tensor) -> bool:
        """A weight (op NONE) or a node already placed."""
        return t.op == "NONE" or t in self.placed

    def _pull_partners(self, j: int, current: list[int]) -> None:
        """The fusion partners ``nodes[j]`` pulls into the set after it (ggml/src/ggml-vulkan/ggml-vulkan.cpp:14887
        GGML_OP_RMS_NORM + MUL's ROPE and the rest), each the first fitting of the next 14 nodes."""
        op, before = self.nodes[j].op, self.nodes[j - 1].op if j > 0 else ""
        store_from = j
        if op == "MUL" and before == "RMS_NORM":
            store_from = self._pull_rope(j, current)
        if self.nodes[store_from].op in ("ROPE", "RMS_NORM"):
            self._pull_store(store_from, current)
        if op == "ADD_ID" and before == "MUL_MAT_ID":
            self._pull_consumer(j, "MUL", current)
        if op == "ADD" and before == "MUL_MAT":
            self._pull_consumer(j, "ADD", current)
        if op == "ADD" and before == "SSM_CONV":
            for k in self._ahead(j):
                if self.nodes[k].op == "UNARY" and _src(self.nodes[k], 0) is self.nodes[j]:
                    self._pull(k, current)
                    break
        if op == "UNARY" and j > 0:
            self._pull_unary_mul(j, current)

    def _pull_rope(self, j: int, current: list[int]) -> int:
        """The ROPE of the RMS_NORM + MUL ``nodes[j]`` whose other sources are inputs (op NONE), pulled; its index,
        or ``j`` where there is none."""
        for k in self._ahead(j):
            rope = self.nodes[k]
            pos, factors = _src(rope, 1), _src(rope, 2)
            if (rope.op == "ROPE" and _src(rope, 0) is self.nodes[j] and pos is not None and pos.op == "NONE"
                    and (factors is None or factors.op == "NONE")):
                self._pull(k, current)
                return k
        return j

    def _pull_store(self, r: int, current: list[int]) -> None:
        """The VIEW of the ROPE or RMS_NORM ``nodes[r]`` and the SET_ROWS storing it, pulled where the three fuse
        (ggml/src/ggml.c:7769 ggml_can_fuse_subgraph_ext with the SET_ROWS as output) and no node left between
        them must run before the SET_ROWS."""
        view = store = -1
        for k in self._ahead(r):
            node = self.nodes[k]
            if self.used[k]:
                continue
            if view == -1 and node.op == "VIEW" and _src(node, 0) is self.nodes[r]:
                view = k
                continue
            if view != -1 and node.op == "SET_ROWS" and _src(node, 0) is self.nodes[view]:
                store = k
                break
        if store == -1 or not self._can_fuse((r, view, store), store):
            return
        for c in range(r + 1, store):
            if (not self.used[c] and c != view and not is_empty(self.nodes[c])
                    and is_src_of(self.nodes[store], self.nodes[c])):
                return
        self._pull(view, current)
        self._pull(store, current)

    def _can_fuse(self, idxs: Sequence[int], output: int) -> bool:
        """ggml_can_fuse_subgraph_ext over ``nodes[idxs]`` (ops matched by the caller, every node computed) with
        ``nodes[output]`` used outside (planner.ggml.fusion.can_fuse_subgraph)."""
        return can_fuse_subgraph([self.nodes[i] for i in idxs], (self.nodes[output],), self.uses)

    def _pull_consumer(self, j: int, op: str, current: list[int]) -> None:
        """The ``op`` node reading ``nodes[j]`` as its first source whose second is ready, pulled (MUL_MAT_ID +
        ADD_ID + MUL, MUL_MAT + ADD + ADD)."""
        for k in self._ahead(j):
            node = self.nodes[k]
            second = _src(node, 1)
            if node.op == op and _src(node, 0) is self.nodes[j] and second is not None and self._ready(second):
                self._pull(k, current)
                return

    def _pull_unary_mul(self, j: int, current: list[int]) -> None:
        """The MUL reading the UNARY ``nodes[j]`` whose other source is ready, pulled where Vulkan fuses the two."""
        unary = self.nodes[j]
        for k in self._ahead(j):
            mul = self.nodes[k]
            a, b = _src(mul, 0), _src(mul, 1)
            if mul.op != "MUL" or (a is not unary and b is not unary):
                continue
            other = b if a is unary else a
            if other is None or not self._ready(other):
                continue
            if can_fuse_unary_mul(unary, mul, self.fused_unary):
                self._pull(k, current)
                return
