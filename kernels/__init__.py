"""The recurrent-state kernels of llama.cpp's recurrent layers, one folder per op.

Each op folder holds its implementations only, each file named for the algorithm it runs (as
flash-linear-attention's naive / fused_recurrent / chunk); which one a call runs is the one dispatcher's choice
(``dispatch.py``: Triton on CUDA, C on the CPU, torch elsewhere, from its table ``PATHS``):

    ==================  ====================================================================================
    file                what it is
    ==================  ====================================================================================
    reference.py        ``<op>_ref``: plain torch, fp32, one recurrence step per line; the others are tested
                        against it
    recurrent.py        ``<op>_torch``: vectorised torch stepping the state token by token (decode); hands
                        ubatches of ``_chunk.MIN_TOKENS`` tokens or more to ``chunked.py``; the ``*_bytes``
                        counts (the least bytes a call moves)
    chunked.py          the chunked form in torch, for prefill: a chunk of tokens at a time from GEMMs instead
                        of one state update per token (``_chunk``, ``_chunk_dplr``; conv_state: a blocked conv)
    fused_recurrent.py  ``<op>_triton``: one Triton kernel that keeps the state in registers across the token
                        loop (CUDA)
    native.py           ``<op>_native``: the C kernels of ``native.c`` via ctypes (one-token CPU steps)
    profile.py          the profiler's inputs and byte count of one call (``registry.py``)
    ==================  ====================================================================================

``state_copy`` has no recurrence: ``row_copy.py`` (torch index_select / index_copy_) and ``fused_row_copy.py``
(a Triton row copy). ``shortconv`` runs its gates around conv_state's paths (its ``fused_recurrent.py`` around
conv_state's Triton kernel). ``registry.py`` lists the ops with their keyword dims (``OPS``).
Reference and fast paths share one keyword-only signature, one return tuple and one set of row rules.

Ops: ``state_copy`` (``state_gather`` = ggml_get_rows with the zero row, ``state_scatter`` = copy-back of the
extra rows), ``ssm_scan`` (Mamba-2 and Mamba-1 selective scan), ``conv_state`` (ggml_ssm_conv with the conv
window planes; also RWKV's token shift), ``gated_delta`` (gated delta net and KDA), ``rwkv6``, ``rwkv7``,
``lightning`` (MiniMax-01) and ``shortconv`` (LFM2).

Shape legend (shared by every docstring):
    N  sequences in the ubatch (llama.cpp n_seqs)     T  tokens per sequence (n_seq_tokens)
    H  heads                                          G  groups of B / C (Mamba-2), H % G == 0
    P  head dim of x (Mamba-2)                        S  state size (d_state), or head dim of a square state
    Hk / Hv  key / value heads (delta nets)           Dk / Dv  key / value head dims (delta nets)
    D  channels (conv)                                W  conv kernel width (d_conv; the window holds W - 1)
    R  rows of a state pool = M * K                   M  cells (mem_size)      K  planes (n_rs_seq + 1)
    E  rows moved by a gather / scatter

Row rules (every op that reads and writes a pool):
    - sequence ``i`` reads its input state from row ``src_rows[i]`` (llama.cpp's ``s_copy``) and writes plane
      ``p`` of its output to row ``p * M + dst_rows[i]``;
    - a negative ``src_rows[i]`` or ``dst_rows[i]`` marks padding: nothing is read or written for it, and its
      rows of the output ``y`` are left as they were;
    - all reads happen before any write, as in llama.cpp's graph (the input rows of one sequence may be the
      output rows of another after find_slot swapped cells);
    - planes: ``p < min(T, K)`` receive the state after ``T - p`` tokens; planes ``p >= T`` are not written
      (``clamp_planes`` conv ops write them with the window from before the ubatch).
Pools may be fp32 or bf16; arithmetic is fp32 and states are rounded to the pool type only when stored.
"""
