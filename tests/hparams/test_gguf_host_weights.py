"""``rsplan capacity`` on a GGUF: the host weights laid out from the file's own tensor table, its data alignment and
its type names (the reader writes K-quants as ``q4_k``, ggml as ``q4_K``: both are the same type)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.planner.backends.buffers import CPU_RULE, CUDA_RULE
from tests.hparams.test_gguf_file import MAMBA2_KV


def test_k_quant_type_names_in_either_case():
    # a q4_K row of 256 elements is one 144-byte block; CUDA adds the 256 elements that pad a row to 512 (one more
    # block, ggml_backend_cuda_buffer_type_get_alloc_size) and aligns to 128: 4,608 + 144 = 4,752 -> 4,864
    assert CUDA_RULE.alloc_nbytes(4608, "q4_k", 256) == CUDA_RULE.alloc_nbytes(4608, "q4_K", 256) == 4864
    assert CPU_RULE.alloc_nbytes(4608, "q4_k", 256) == 4608


def test_capacity_lays_a_gguf_out_by_its_table(gguf_file):
    # data alignment 64: token_embd (q8_0, 2,176 B) at 0, output.weight (q4_K, 32 rows of 256: 4,608 B) at 2,176,
    # output_norm (40 f32: 160 B, padded to 192) at 6,784, blk.0.attn_norm (256 B) at 6,976, ending at 7,232
    path = gguf_file("mamba2", MAMBA2_KV, alignment=64, tensors=[
        ("token_embd.weight", (32, 64), "q8_0"), ("output.weight", (32, 256), "q4_k"),
        ("output_norm.weight", (40,), "f32"), ("blk.0.attn_norm.weight", (64,), "f32")])
    r = CliRunner().invoke(cli, ["capacity", "-m", str(path), "--budget", "8GiB", "--device-kind", "RPC", "-ngl", "0",
                                 "--ctx", "4k", "--compute", "0", "--host-budget", "8GiB", "--format", "json"])
    assert r.exit_code == 0, r.output
    (host,) = [d for d in json.loads(r.output)["devices"] if d["name"] == "host"]
    # AVX2 repacks the q4_K output matrix (ne[1] = 32, a multiple of 8); the span runs from token_embd to the end of
    # attn_norm, the repacked matrix and output_norm's 32 bytes of padding inside it
    assert host["weight_buffers"] == {"CPU_Mapped": 7232, "CPU_REPACK": 4608}
    assert host["mapped_elsewhere_bytes"] == 4608 + 32 and host["weights_bytes"] == 7232 + 4608
