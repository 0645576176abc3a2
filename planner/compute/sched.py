"""llama.cpp's backend scheduler on one reserve graph: which backend runs each node, where the graph splits, and
the compute buffer each backend then needs (ggml/src/ggml-backend.cpp ``ggml_backend_sched_split_graph`` and
``ggml_backend_sched_reserve_size``, llama.cpp 0c1e57098).

With devices, llama.cpp's scheduler holds one backend per device (in device order) and the CPU backend last, and
one graph-allocator buffer per backend. For a graph it

1. pins what memory already decides: a weight's or cache's node to the backend of its buffer, a view of one to
   the same, a graph input to the CPU, and an op that reads a weight to the weight's backend (ROPE and
   FLASH_ATTN_EXT excepted); with ``op_offload`` an op reading a host weight goes to the first device whose
   ``offload_op`` accepts it (CUDA: a batch of at least 32; RPC: never). llama_context::graph_get_cb pins a layer's
   ``norm`` node to the layer's device when every layer is offloaded or the ubatch has fewer than 32 tokens, and
   ``-nkvo`` pins the merged attention output (without flash attention) to the CPU;
2. spreads device backends down then up over unassigned nodes, then any backend down then up;
3. gives what is still unassigned the backend supporting most of its inputs;
4. gives views their source's backend and unassigned sources their consumer's;
5. cuts the node list where the backend changes and, for each split, copies every source held by another
   backend into the split's backend (one copy per backend and source; with pipeline parallelism ``n_copies`` = 4
   copies each, kept for the whole graph, and 4 copies of every graph input on its own backend);

then ``ggml_gallocr_reserve_n`` lays out the split graph (each split's input copies first) with one buffer per
backend (planner.ggml.alloc.reserve_sizes): each backend's compute buffer is its high-water mark.

Pipeline parallelism (``n_copies`` 4) is on when there is more than one device, every layer is offloaded
(``-ngl`` above the layer count), the split mode is ``layer``, the KV cache is offloaded, no ``-ot`` is given,
and every device reports async compute and events (llama_context's constructor): CUDA and RPC devices do.

What each device kind does is data (``DEVICE_KINDS``): RPC devices (a CPU backend behind the wire: supports every
op, offloads none, 32-byte alignment, ``ggml_nbytes`` as allocation size) are checked against llama.cpp; for CUDA
(and its ROCm / MUSA builds) the rules above come from the source, with its allocation sizes
(planner.backends.cuda_alloc), the ops it does not run (planner.backends.cuda_ops: passes 1 and 2 leave them unassigned,
pass 3 gives them the CPU) and the allocation dependencies its ``graph_optimize`` adds for the MoE weighted reduction
and the top-k MoE router it fuses (planner.backends.cuda_fusion: a node after the reduction's last ADD holds the
experts' output and the weights; a node after the router holds its tensors), and nothing was run on a GPU, so its
figures are estimates (``DeviceKind.exact`` False). (Its pinned ``CUDA_Host`` CPU buffer has the CPU's alignment, and a
discrete GPU cannot read it, so copies are made as for RPC.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rsplan.hparams.ggml_types import GGMLType
from rsplan.hparams.ggml_types import weight_type as weight_type_of
from rsplan.planner.backends.devices import DeviceKind
from rsplan.planner.backends.op_batch import op_batch_size
from rsplan.planner.compute.sched_setup import (
    MATMUL_OPS,
    NO_WEIGHT_RULE_OPS,
    NORM_PIN_TOKENS,
    VIEW_OPS,
    SchedModelError,
    SchedSetup,
)
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import FLAG_INPUT, FLAG_OUTPUT, Graph, Tensor
from rsplan.planner.weights.weight_placement import (
    OverrideMatcher,
    override_matcher,
    where_weight,
)


def _backend_of_buffer(t: Tensor, setup: SchedSetup, overrides: OverrideMatcher,
                       stored_type: Callable[[Tensor], str] | None = None) -> int:
    """The backend whose buffer holds external tensor ``t`` (a weight or a cache); ``overrides``: the matcher of
    ``setup.overrides``; ``stored_type``: a weight's file type, where the loader's test asks it (the model has
    types the devices refuse)."""
    if t.kind == "cache":
        if not isinstance(t.layer, int):
            raise SchedModelError(f"cache tensor '{t.name}' has no layer: its buffer is unknown")
        dev = setup.placement.cache_device(t.layer)
    elif t.kind == "weight":
        layer = 0 if t.layer == "token_embd_norm" else t.layer  # created with layer number 0 (NAMED_LAYERS)
        names = _gguf_names(t, setup)
        loader = setup.loader
        refused = False
        if loader is not None and layer != "input":
            # a tied lm head is token_embd's output-layer copy, tested as the output matrix (MUL_MAT)
            stem = "output" if layer == "output" and t.name == "token_embd" else t.name
            refused = loader.refuses(stem, t.ne, stored_type(t) if stored_type is not None else None)
        devs = {where_weight(n, layer, setup.placement, overrides, refused) for n in names}
        if len(devs) > 1:
            raise SchedModelError(
                f"a weight of layer {t.layer} of shape {list(t.ne)} is one of {', '.join(names)}, which the -ot "
                "patterns put in different buffers: the graph does not say which one")
        dev = devs.pop()
    else:
        raise SchedModelError(f"external tensor '{t.name}' is neither a weight nor a cache: its buffer is unknown")
    return setup.cpu if dev is None else dev


def _gguf_names(t: Tensor, setup: SchedSetup) -> tuple[str, ...]:
    """The GGUF names weight ``t`` may have, as ``-ot`` patterns see them: with overrides and the model's layer
    tensors, those of its layer and shape (of its kind where the builder names it, any suffix: ``.weight``,
    ``.bias``, none); else ``_gguf_name``'s one."""
    if not setup.overrides or setup.tensors is None or not isinstance(t.layer, int):
        return (_gguf_name(t),)
    names = setup.tensors.names(t.layer, t.name, tuple(t.ne))
    if not names:
        raise SchedModelError(f"no tensor of layer {t.layer} has the shape {list(t.ne)} of the graph's weight "
                              f"'{t.name or '?'}': which -ot pattern places it is unknown")
    return names


#: The stem of a global weight the graph builder leaves unnamed, by layer.
_GLOBAL_STEMS = {"input": "token_embd", "output": "output_norm", "token_embd_norm": "token_embd_norm"}


def _gguf_name(t: Tensor) -> str:
    """The GGUF name of weight ``t`` as ``-ot`` patterns see it: a global one's name (``.weight`` added unless
    it has a suffix, e.g. ``output_norm.bias``); a layer's ``blk.N.NAME.weight`` (used without the model's
    ``LayerTensors`` only; weights the graph builders leave unnamed get ``unnamed``)."""
    if isinstance(t.layer, str) and t.layer in _GLOBAL_STEMS:
        stem = t.name or _GLOBAL_STEMS[t.layer]
        return stem if "." in stem else f"{stem}.weight"
    if isinstance(t.layer, int):
        return f"blk.{t.layer}.{t.name or 'unnamed'}.weight"
    raise SchedModelError(f"weight '{t.name or '?'}' has no layer: the graph builder does not place it")


class BackendAssignment:
    """ggml_backend_sched state for one graph: the backend of every tensor (``Tensor.backend``; -1: none yet) and
    of every external tensor's buffer (``Tensor.home``), set afresh for the graph's tensors here; ``redirected``:
    the nodes whose sources the split pointed to input copies, with their own sources."""

    def __init__(self, graph: Graph, setup: SchedSetup, n_tokens: int,
                 homes: dict[tuple[Any, ...], int] | None = None) -> None:
        self.graph = graph
        self.setup = setup
        self.n_tokens = n_tokens
        self.cpu = setup.cpu
        self.redirected: list[tuple[Tensor, tuple[Tensor, ...]]] = []
        # by what decides a buffer: kind, layer, name and a weight's shape (a layer's ssm_conv1d is its .weight or
        # its .bias by shape, and -ot patterns may tell them apart: _gguf_names); a cache's shape may be affine in
        # the KV cells (planner.compute.reuse.kept_shapes), and its layer alone places it
        # ``homes``: these decisions under ``setup`` made before (a sizing session's, planner.compute.reuse.session;
        # a function of the setup alone), filled in here; None: made afresh for this graph
        homes = {} if homes is None else homes
        overrides = override_matcher(tuple(setup.overrides))
        # the model's file types that the devices' matrix products do not take (the loader puts such weights in
        # host memory, and the devices refuse the products reading them)
        tensors, takes = setup.tensors, setup.kind.takes_weight
        self.refused_types = (tensors.refused_types(takes) if takes is not None and tensors is not None
                              and tensors.types else frozenset())
        self._stored: dict[Tensor, str] = {}
        stored_type = self.stored_type if self.refused_types else None

        def set_home(x: Tensor) -> None:
            key = (x.kind, x.layer, x.name, x.ne if x.kind == "weight" else None)
            home = homes.get(key)
            if home is None:
                home = homes[key] = _backend_of_buffer(x, setup, overrides, stored_type)
            x.home = home

        for t in [*graph.leafs, *graph.nodes]:
            t.backend = -1
            if t.external:
                set_home(t)
            for x in t.src:
                x.backend = -1
                if x.external:
                    set_home(x)
            vs = t.view_src
            if vs is not None:
                vs.backend = -1
                if vs.external:
                    set_home(vs)

    def buft_of(self, t: Tensor) -> int | None:
        """The buffer type (as the backend index owning it) ``t`` lives in or will: its buffer's, else its
        backend's (ggml_backend_sched_buffer_supported)."""
        root = t.view_src if t.view_src is not None else t
        if root.external:
            return root.home
        b = t.backend
        if b == -1 and t.view_src is not None:
            b = t.view_src.backend
        return None if b == -1 else b

    def supported(self, t: Tensor, backend: int) -> bool:
        """ggml_backend_sched_buffer_supported: every buffer type here is supported only by its own backend."""
        return self.buft_of(t) == backend

    def from_cur(self, t: Tensor) -> int:
        """ggml_backend_sched_backend_id_from_cur (pass 1)."""
        root = t.view_src if t.view_src is not None else t
        if root.external:
            return root.home
        if t.flags & FLAG_INPUT:
            return self.cpu
        if t.op in NO_WEIGHT_RULE_OPS:
            return -1
        for src in t.src:
            if src.kind == "weight":
                b = src.home
                if not self.runs(t, b):  # ggml_backend_sched_backend_from_buffer: no backend both reads the
                    return -1  # weight's buffer and runs the op
                if self.setup.op_offload and b == self.cpu:
                    for dev in range(self.cpu):
                        if self.runs(t, dev) and _offloads(self.setup.kind, t):
                            return dev
                return b
        return -1

    def stored_type(self, w: Tensor) -> str:
        """The file type of weight ``w`` (planner.compute.sched.weight_type), remembered."""
        hit = self._stored.get(w)
        if hit is None:
            hit = self._stored[w] = weight_type(w, self.setup).name
        return hit

    def runs(self, t: Tensor, backend: int) -> bool:
        """ggml_backend_supports_op: the CPU runs every op; a device what its kind's ``supports_op`` says, and no
        matrix product of a weight whose file type it does not take."""
        if backend == self.cpu:
            return True
        supports = self.setup.kind.supports_op
        if supports is not None and not supports(t):
            return False
        if self.refused_types and t.op in MATMUL_OPS:
            w = t.src[0]
            root = w.view_src if w.view_src is not None else w
            return root.kind != "weight" or self.stored_type(root) not in self.refused_types
        return True

    def pin(self) -> None:
        """The assignments llama.cpp makes while building the graph (llama_context::graph_get_cb, -nkvo)."""
        setup = self.setup
        pin_norm = self.n_tokens < NORM_PIN_TOKENS or setup.full_offload
        for node in self.graph.nodes:
            if pin_norm and node.name == "norm" and isinstance(node.layer, int):
                dev = setup.placement.layer_device(node.layer)
                node.backend = self.cpu if dev is None else dev
            elif node.name == g.KQV_OUT_NO_OFFLOAD and not setup.offload_kqv:
                node.backend = self.cpu

    def pass1(self) -> None:
        for t in [*self.graph.leafs, *self.graph.nodes]:
            if t.backend == -1:
                t.backend = self.from_cur(t)

    def expand(self, order: Sequence[Tensor], skip: int) -> None:
        """One expansion pass over ``order`` (the nodes that are not views): unassigned nodes take the backend of
        the last assigned one where it runs them (ggml_backend_sched_set_if_supported; an op it does not run stays
        unassigned); nodes of backend ``skip`` (the CPU, or -1 for none) stop the run instead."""
        cur = -1
        runs = self.runs
        for node in order:
            b = node.backend
            if b != -1:
                cur = -1 if b == skip else b
            elif cur != -1 and runs(node, cur):
                node.backend = cur

    def pass3(self) -> None:
        """Unassigned nodes: of the backends that run the op, the one with the most inputs in a buffer it supports
        (no upgrades: every buffer type here belongs to one backend)."""
        for node in self.graph.nodes:
            if node.op in VIEW_OPS or node.backend != -1:
                continue
            best = -1
            for b in range(self.setup.n_backends):
                if not self.runs(node, b):
                    continue
                n = sum(1 for s in node.src if _assigned(s) and self.supported(s, b))
                if n > best:
                    best, node.backend = n, b

    def pass4(self) -> None:
        for node in self.graph.nodes:
            if node.view_src is not None and node.backend == -1:
                node.backend = node.view_src.backend
            for src in node.src:
                if src.backend == -1:
                    src.backend = src.view_src.backend if src.view_src is not None else node.backend
            if node.backend == -1:  # the first backend that runs it (the CPU runs every op)
                node.backend = next(b for b in range(self.setup.n_backends) if self.runs(node, b))

    def split(self) -> tuple[list[tuple[int, int, list[Tensor]]], dict[tuple[int, int], list[Tensor]]]:
        """Pass 5: the splits as (backend, first node, inputs) and the copies of each (source, backend); the
        nodes' sources are redirected to copy 0 (the scheduler's cur_copy during a reserve; ``redirected`` keeps
        what they were)."""
        n_copies = self.setup.n_copies
        nodes = self.graph.nodes
        splits: list[tuple[int, int, list[Tensor]]] = []
        copies: dict[tuple[int, int], list[Tensor]] = {}
        first = next((n for n in nodes if n.op not in VIEW_OPS), None)
        cur = first.backend if first is not None else self.cpu
        inputs: list[Tensor] = []
        splits.append((cur, 0, inputs))
        for i, node in enumerate(nodes):
            if node.op in VIEW_OPS:
                continue
            b = node.backend
            if b != cur or (inputs and self._weight_elsewhere(node, cur)):
                cur, inputs = b, []
                splits.append((cur, i, inputs))
            if all(src.backend == cur for src in node.src):
                continue
            new_src = list(node.src)
            for j, src in enumerate(node.src):
                if src.backend == cur or self.supported(src, cur):
                    continue
                key = (id(src), cur)
                if key not in copies:
                    type_, nb = copy_layout(src, self.setup)
                    copies[key] = [_copy(src, type_, nb, n_copies) for _ in range(n_copies)]
                    inputs.append(src)
                new_src[j] = copies[key][0]
            self.redirected.append((node, node.src))
            node.src = tuple(new_src)
        return splits, copies

    def _weight_elsewhere(self, node: Tensor, cur: int) -> bool:
        """A weight source on another backend whose buffer ``cur`` cannot read starts a new split."""
        return any(s.kind == "weight" and s.backend != cur and not self.supported(s, cur) for s in node.src)


def _assigned(t: Tensor) -> bool:
    """``t`` or its view source has a backend already."""
    return t.backend != -1 or (t.view_src is not None and t.view_src.backend != -1)


def _offloads(kind: DeviceKind, t: Tensor) -> bool:
    """``offload_op`` of a device of ``kind`` for node ``t``: the kind's own, else CUDA's get_op_batch_size against
    the minimum batch."""
    if kind.offload_op is not None:
        return kind.offload_op(t)
    if kind.offload_min_batch is None:
        return False
    return op_batch_size(t) >= kind.offload_min_batch


def refused_ops(s: BackendAssignment) -> tuple[tuple[str, int], ...]:
    """The ops of ``s``'s assigned graph that its devices do not run (``BackendAssignment.runs``), with their counts,
    where every layer is on a device (with layers on the host, the ops of those run there anyway); none where the kind
    runs every op on every weight type. Such an op is on the CPU after pass 3, so only the CPU's nodes are asked."""
    setup = s.setup
    if (setup.kind.supports_op is None and not s.refused_types) or not setup.full_offload or not setup.cpu:
        return ()
    return tuple(_refused_counts(s, s.graph.nodes).items())


def _refused_counts(s: BackendAssignment, nodes: Iterable[Tensor]) -> dict[str, int]:
    """``refused_ops``' counts over ``nodes``, in the order the ops first appear."""
    counts: dict[str, int] = {}
    cpu = s.setup.cpu
    for node in nodes:
        if node.backend == cpu and node.op not in VIEW_OPS and not s.runs(node, 0):
            counts[node.op] = counts.get(node.op, 0) + 1
    return counts


def assign_backends(graph: Graph, setup: SchedSetup, n_tokens: int, pins: bool,
                    homes: dict[tuple[Any, ...], int] | None = None) -> BackendAssignment:
    """Passes 1 to 4: every node and leaf of ``graph`` gets a backend (``homes``: as BackendAssignment's)."""
    s = BackendAssignment(graph, setup, n_tokens, homes)
    if pins:
        s.pin()
    s.pass1()
    nodes = [n for n in graph.nodes if n.op not in VIEW_OPS]  # the expansion passes skip views
    s.expand(nodes, skip=setup.cpu)
    s.expand(nodes[::-1], skip=setup.cpu)
    s.expand(nodes, skip=-1)
    s.expand(nodes[::-1], skip=-1)
    s.pass3()
    s.pass4()
    return s


def flash_attn_on_layer_devices(s: BackendAssignment) -> bool:
    """llama_context::resolve_fused_ops for ``-fa auto``: every FLASH_ATTN_EXT node of the probe graph (one token
    per sequence, built with flash attention), assigned with its pins (``assign_backends``), runs on its layer's
    device; False makes llama.cpp turn flash attention off (e.g. with ``-nkvo``, where the op lands on the CPU
    beside the cache)."""
    setup = s.setup
    for node in s.graph.nodes:
        if node.op == "FLASH_ATTN_EXT" and isinstance(node.layer, int):
            dev = setup.placement.layer_device(node.layer)
            if node.backend != (setup.cpu if dev is None else dev):
                return False
    return True


def _copy(src: Tensor, type_: GGMLType, nb: tuple[int, int, int, int], n_copies: int) -> Tensor:
    """ggml_dup_tensor_layout: a tensor of ``src``'s type, shape and strides (``copy_layout``); with several copies
    an input and an output (never overwritten, never freed)."""
    flags = FLAG_INPUT | FLAG_OUTPUT if n_copies > 1 else 0
    return Tensor(op="NONE", type=type_, ne=src.ne, nb=nb, flags=flags, name=f"copy of {src.name}")


def copy_layout(src: Tensor, setup: SchedSetup) -> tuple[GGMLType, tuple[int, int, int, int]]:
    """The type and strides of ``src``'s copy in another backend's compute buffer: its own, except for a weight
    (its file's type, contiguous), which a device copies when ``offload_op`` takes an op reading it from the host
    (ggml-cuda.cu: a batch of 32 or more, e.g. the experts of ``--n-cpu-moe`` at ``-ub 512``): the graph builders
    give weights f32 shapes only (planner.ggml.ops.weight), and the copy is as large as the stored tensor."""
    root = src.view_src if src.view_src is not None else src
    if root.kind != "weight":
        return src.type, src.nb
    type_ = weight_type(root, setup)
    if type_ == src.type:  # an f32 weight (a norm, RWKV's mixing vectors): as the graph builder laid it out
        return src.type, src.nb
    if src is not root:
        raise SchedModelError(f"a view of {type_.name} weight '{root.name or '?'}' is copied to another backend: its "
                              "layout there is not modelled")
    if src.ne[0] % type_.block_size:
        raise SchedModelError(f"weight '{src.name or '?'}' of shape {list(src.ne)} is not whole {type_.name} blocks")
    return type_, g.contiguous_nb(type_, src.ne)


def weight_type(t: Tensor, setup: SchedSetup) -> GGMLType:
    """The ggml type weight ``t`` is stored in: its GGUF tensor's (``LayerTensors.types``), found by layer, kind
    and shape for a layer's weight (``LayerTensors.names``), by name for a global one."""
    tensors = setup.tensors
    if tensors is None or not tensors.types:
        raise SchedModelError(f"a device copies weight '{t.name or '?'}' of layer {t.layer} from another buffer, and "
                              "the copy's size needs the weight's type, which only the model's tensor list gives "
                              "(a GGUF file or --quant)")
    names = tensors.names(t.layer, t.name, tuple(t.ne)) if isinstance(t.layer, int) else (_gguf_name(t),)
    found = {tensors.types.get(n) for n in names}
    name = found.pop() if len(found) == 1 else None
    type_ = weight_type_of(name) if name is not None else None
    if type_ is None:
        raise SchedModelError(f"the type of weight '{t.name or '?'}' of layer {t.layer} (shape {list(t.ne)}) is not "
                              f"one known type: {', '.join(names) or 'no tensor'} in the model's tensor list")
    return type_
