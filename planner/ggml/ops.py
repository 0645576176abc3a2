"""The ggml ops llama.cpp's graphs use, as shape rules only (ggml/src/ggml.c, llama.cpp 0c1e57098).

Each function returns the ``Tensor`` ggml would create: same op name, type, ``ne``, strides, sources and view
source (a view's ``view_src`` is always the tensor that owns the memory, and its ``view_offs`` accumulates, as in
``ggml_new_tensor_impl``). No data is computed. ``GraphBuilder.expand`` records nodes and leafs in the order
``ggml_build_forward_expand`` does, so ``ggml_alloc.reserve_size`` sees the graph llama.cpp reserves.
"""

from __future__ import annotations

from rsplan.errors import RsplanError
from rsplan.hparams.ggml_types import GGMLType
from rsplan.planner.ggml.alloc import FLAG_INPUT, FLAG_OUTPUT, Graph, Tensor

F32 = GGMLType("f32", 1, 4)
F16 = GGMLType("f16", 1, 2)
I32 = GGMLType("i32", 1, 4)
I64 = GGMLType("i64", 1, 8)

Shape = tuple[int, int, int, int]


def _ne(*ne: int) -> Shape:
    n = len(ne)
    if n == 4:
        return ne  # type: ignore[return-value]  # four ints
    if n == 2:
        return (ne[0], ne[1], 1, 1)
    if n == 3:
        return (ne[0], ne[1], ne[2], 1)
    full = (*ne, 1, 1, 1, 1)[:4]
    return (full[0], full[1], full[2], full[3])


def contiguous_nb(type_: GGMLType, ne: Shape) -> Shape:
    """The strides of a contiguous tensor of ``type_`` and shape ``ne`` (ggml_new_tensor_impl)."""
    nb0 = type_.type_size
    nb1 = nb0 * (ne[0] // type_.block_size)
    nb2 = nb1 * ne[1]
    return (nb0, nb1, nb2, nb2 * ne[2])


def new_tensor(type_: GGMLType, *ne: int, op: str = "NONE", src: tuple[Tensor, ...] = (), flags: int = 0,
               external: bool = False, name: str = "") -> Tensor:
    """A fresh contiguous tensor (ggml_new_tensor_Nd)."""
    shape = _ne(*ne)
    # positional: a dataclass __init__ takes keywords at twice the cost, and graphs create thousands of tensors
    return Tensor(op, type_, shape, contiguous_nb(type_, shape), src, None, flags, external, name)


#: The name of the merged attention output (without flash attention) that ``-nkvo`` pins to the CPU
#: (llm_graph_context::build_attn_mha: ggml_backend_sched_set_tensor_backend(cur, backend_cpu)).
KQV_OUT_NO_OFFLOAD = "kqv_out (CPU with -nkvo)"

def weight(*ne: int, layer: int | str | None, name: str = "") -> Tensor:
    """A model tensor of llama.cpp layer ``layer`` (a repeating layer number, ``input``, ``output``, or None):
    held by the model's buffers, never by the compute buffer (its type does not matter here). ``name``: its GGUF
    name within the layer (``ffn_up_exps``), which ``-ot`` patterns match."""
    shape = _ne(*ne)
    return Tensor("NONE", F32, shape, contiguous_nb(F32, shape), (), None, 0, True, name, 0, "weight", layer)


def cache_tensor(type_: GGMLType, *ne: int, layer: int | str | None, name: str = "") -> Tensor:
    """A KV or recurrent cache tensor of llama.cpp layer ``layer``: memory of the context, not of the compute
    buffer."""
    shape = _ne(*ne)
    return Tensor("NONE", type_, shape, contiguous_nb(type_, shape), (), None, 0, True, name, 0, "cache", layer)


def input_tensor(type_: GGMLType, *ne: int, name: str = "") -> Tensor:
    """ggml_new_tensor + ggml_set_input."""
    return new_tensor(type_, *ne, flags=FLAG_INPUT, name=name)


def _view(a: Tensor, op: str, ne: Shape, nb: Shape, offset: int, src: tuple[Tensor, ...] | None = None) -> Tensor:
    root = a.view_src
    if root is None:
        root = a
    else:
        offset += a.view_offs
    return Tensor(op, a.type, ne, nb, (a,) if src is None else src, root, 0, False, "", offset)


def reshape(a: Tensor, *ne: int) -> Tensor:
    """ggml_reshape_Nd: ``a`` viewed as ``ne``. A shape that does not hold a's elements aborts as ggml asserts,
    GGML_ASSERT(ggml_nelements(a) == ne0*ne1*...) (ggml/src/ggml.c:3751 ggml_reshape_3d for 3 dims), e.g. tokens
    per sequence rounded down to 0."""
    shape = _ne(*ne)
    have = a.ne[0] * a.ne[1] * a.ne[2] * a.ne[3]
    if have != shape[0] * shape[1] * shape[2] * shape[3]:
        product = "*".join(f"ne{i}" for i in range(len(ne)))
        raise GGMLAbort(f"GGML_ASSERT(ggml_nelements(a) == {product}) fails in ggml_reshape_{len(ne)}d: "
                        f"{have} elements of shape {list(a.ne)} into {list(ne)}")
    return _view(a, "RESHAPE", shape, contiguous_nb(a.type, shape), 0)


def view(a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...], offset: int) -> Tensor:
    """ggml_view_Nd: ``ne`` of N dims, ``nb`` the N-1 outer strides."""
    shape = _ne(*ne)
    nb0 = a.type.type_size
    if len(nb) == 3:
        return _view(a, "VIEW", shape, (nb0, *nb), offset)
    strides = [nb0, *nb]
    for i in range(len(strides), 4):
        strides.append(strides[i - 1] * shape[i - 1])
    return _view(a, "VIEW", shape, (strides[0], strides[1], strides[2], strides[3]), offset)


def view_tensor(a: Tensor, op: str, src: tuple[Tensor, ...]) -> Tensor:
    """ggml_view_tensor(a) given ``op`` and ``src`` (in-place ops, CPY)."""
    return _view(a, op, a.ne, a.nb, 0, src)


def transpose(a: Tensor) -> Tensor:
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return _view(a, "TRANSPOSE", ne, nb, 0)


def permute(a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    ne = [0, 0, 0, 0]
    nb = [0, 0, 0, 0]
    for src_axis, dst_axis in enumerate((axis0, axis1, axis2, axis3)):
        ne[dst_axis] = a.ne[src_axis]
        nb[dst_axis] = a.nb[src_axis]
    return _view(a, "PERMUTE", (ne[0], ne[1], ne[2], ne[3]), (nb[0], nb[1], nb[2], nb[3]), 0)


def _like(op: str, a: Tensor, *src: Tensor) -> Tensor:
    """ggml_dup_tensor(a) as the result of ``op`` (same type and shape, contiguous)."""
    return Tensor(op, a.type, a.ne, contiguous_nb(a.type, a.ne), (a, *src))


class GGMLAbort(RsplanError):
    """A shape check ggml asserts (GGML_ASSERT) failed: llama.cpp aborts while building this graph."""


def _can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_repeat(t0, t1): t0 broadcasts over t1 (an empty t0 only onto an empty t1)."""
    a, b = t0.ne, t1.ne
    if 0 in a:
        return 0 in b
    return b[0] % a[0] == 0 and b[1] % a[1] == 0 and b[2] % a[2] == 0 and b[3] % a[3] == 0


def _binary(op: str, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add / sub / mul / div: ``b`` is broadcast over ``a`` (GGML_ASSERT(ggml_can_repeat(b, a)))."""
    if b.ne != a.ne and not _can_repeat(b, a):  # same shapes (the common case) always repeat
        raise GGMLAbort(f"GGML_ASSERT(ggml_can_repeat(b, a)) fails in ggml_{op.lower()}: b of shape {list(b.ne)} "
                        f"does not repeat onto a of shape {list(a.ne)}")
    return _like(op, a, b)


def add(a: Tensor, b: Tensor) -> Tensor:
    return _binary("ADD", a, b)


def mul(a: Tensor, b: Tensor) -> Tensor:
    return _binary("MUL", a, b)


def sub(a: Tensor, b: Tensor) -> Tensor:
    return _binary("SUB", a, b)


def rms_norm(a: Tensor) -> Tensor:
    return _like("RMS_NORM", a)


def norm(a: Tensor) -> Tensor:
    """ggml_norm: layer norm without weights (GGML_OP_NORM, not in-place)."""
    return _like("NORM", a)


def l2_norm(a: Tensor) -> Tensor:
    """ggml_l2_norm (GGML_OP_L2_NORM, not in-place)."""
    return _like("L2_NORM", a)


def sqr(a: Tensor) -> Tensor:
    return _like("SQR", a)


def unary(a: Tensor) -> Tensor:
    """silu, exp, softplus, sigmoid, ...: GGML_OP_UNARY."""
    return _like("UNARY", a)


def cont(a: Tensor) -> Tensor:
    return _like("CONT", a)


def scale(a: Tensor) -> Tensor:
    return _like("SCALE", a)


def scale_inplace(a: Tensor) -> Tensor:
    return view_tensor(a, "SCALE", (a,))


def cpy(a: Tensor, b: Tensor) -> Tensor:
    return view_tensor(b, "CPY", (a, b))


def swiglu_split(a: Tensor, b: Tensor) -> Tensor:
    return _like("GLU", a, b)


def cont_nd(a: Tensor, *ne: int) -> Tensor:
    """ggml_cont_2d/3d/4d: a contiguous copy of ``a`` with a new shape."""
    return new_tensor(a.type, *ne, op="CONT", src=(a,))


def set_rows(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Rows of ``b`` written into ``a`` at indices ``c``: a view of ``a`` (sources in ggml's legacy order)."""
    return view_tensor(a, "SET_ROWS", (b, c, a))


def rope(a: Tensor, pos: Tensor) -> Tensor:
    return _like("ROPE", a, pos)


def soft_max_ext(a: Tensor, mask: Tensor | None) -> Tensor:
    return _like("SOFT_MAX", a, *((mask,) if mask is not None else ()))


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    src = (q, k, v, *((mask,) if mask is not None else ()))
    return new_tensor(F32, v.ne[0], q.ne[2], q.ne[1], q.ne[3], op="FLASH_ATTN_EXT", src=src)


def mul_mat_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Per-token expert matrices: [a.ne1, ids.ne0, b.ne2]."""
    return new_tensor(F32, a.ne[1], ids.ne[0], b.ne[2], 1, op="MUL_MAT_ID", src=(a, b, ids))


def repeat(a: Tensor, *ne: int) -> Tensor:
    return new_tensor(a.type, *ne, op="REPEAT", src=(a,))


def soft_max(a: Tensor) -> Tensor:
    return _like("SOFT_MAX", a)


def argsort_top_k(a: Tensor, k: int) -> Tensor:
    """ggml_argsort_top_k: the first k columns of an I32 argsort."""
    idx = new_tensor(I32, *a.ne, op="ARGSORT", src=(a,))
    return view(idx, (k, idx.ne[1], idx.ne[2], idx.ne[3]), (idx.nb[1], idx.nb[2], idx.nb[3]), 0)


def sum_rows(a: Tensor) -> Tensor:
    return new_tensor(F32, 1, a.ne[1], a.ne[2], a.ne[3], op="SUM_ROWS", src=(a,))


def clamp(a: Tensor) -> Tensor:
    return _like("CLAMP", a)


def div(a: Tensor, b: Tensor) -> Tensor:
    return _binary("DIV", a, b)


def cast(a: Tensor, type_: GGMLType) -> Tensor:
    """ggml_cast: a CPY into a new tensor of ``type_`` that lists itself as its second source."""
    out = new_tensor(type_, *a.ne, op="CPY", src=(a,))
    out.src = (a, out)
    return out


def is_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous: rows packed, dimensions of size 1 ignored."""
    next_nb = t.type.type_size
    if t.ne[0] != t.type.block_size and t.nb[0] != next_nb:
        return False
    next_nb *= t.ne[0] // t.type.block_size
    for i in range(1, 4):
        if t.ne[i] != 1:
            if t.nb[i] != next_nb:
                return False
            next_nb *= t.ne[i]
    return True


def get_rows(a: Tensor, b: Tensor) -> Tensor:
    type_ = I32 if a.type == I32 else F32
    return new_tensor(type_, a.ne[0], b.ne[0], b.ne[1], b.ne[2], op="GET_ROWS", src=(a, b))


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    shape = (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
    return Tensor("MUL_MAT", F32, shape, contiguous_nb(F32, shape), (a, b))


def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return new_tensor(a.type, *ne, op="CONCAT", src=(a, b))


def ssm_conv(sx: Tensor, c: Tensor) -> Tensor:
    d_conv, d_inner = c.ne[0], c.ne[1]
    return new_tensor(F32, d_inner, sx.ne[0] - d_conv + 1, sx.ne[2], op="SSM_CONV", src=(sx, c))


def ssm_scan(s: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, ids: Tensor, k: int) -> Tensor:
    """y for every token, then K state planes per sequence, in one f32 vector."""
    n = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3] + k * s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0]
    return new_tensor(F32, n, op="SSM_SCAN", src=(s, x, dt, a, b, c, ids))


def rwkv_wkv7(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor) -> Tensor:
    """ggml_rwkv_wkv7: the output rows of every token, then the new state of each sequence, in one f32 matrix
    [S * H, n_tokens + S * n_seqs] (k: [S, H, n_tokens]; state: [S * S * H, n_seqs])."""
    s, h, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    return new_tensor(F32, s * h, n_tokens + s * state.ne[1], op="RWKV_WKV7", src=(r, w, k, v, a, b, state))


def rwkv_wkv6(k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor, state: Tensor) -> Tensor:
    """ggml_rwkv_wkv6: the output rows of every token, then the new state of each sequence, in one f32 matrix
    [S * H, n_tokens + S * n_seqs] (k: [S, H, n_tokens]; state: [S * S * H, n_seqs])."""
    s, h, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    return new_tensor(F32, s * h, n_tokens + s * state.ne[1], op="RWKV_WKV6", src=(k, v, r, tf, td, state))


def gated_linear_attn(k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor) -> Tensor:
    """ggml_gated_linear_attn: laid out as ggml_rwkv_wkv6's result (the token rows, then the new states)."""
    s, h, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    return new_tensor(F32, s * h, n_tokens + s * state.ne[1], op="GATED_LINEAR_ATTN", src=(k, v, q, g, state))


class GraphBuilder:
    """Collects nodes and leafs in ``ggml_build_forward_expand`` order (sources first, left to right)."""

    def __init__(self) -> None:
        self.graph = Graph()
        self._seen: set[Tensor] = set()  # tensors hash by identity (eq=False)

    def expand(self, tensor: Tensor) -> Tensor:
        """ggml_visit_parents: a tensor is marked when first entered, its sources are visited left to right,
        then it is appended (op NONE: to the leafs, else to the nodes).

        Without recursion (a graph's chains run thousands of tensors deep): the stack holds the tensors entered
        and not yet appended; the top one's next source to visit is its first unmarked one (those before it were
        marked, and stay so), so no iterator is kept per tensor."""
        seen = self._seen
        if tensor in seen:
            return tensor
        seen.add(tensor)
        leafs, nodes = self.graph.leafs, self.graph.nodes
        stack = [tensor]
        while stack:
            t = stack[-1]
            for s in t.src:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
                    break
            else:
                stack.pop()
                if t.op == "NONE":
                    leafs.append(t)
                else:
                    nodes.append(t)
        return tensor

    @staticmethod
    def set_output(t: Tensor) -> None:
        t.flags |= FLAG_OUTPUT
