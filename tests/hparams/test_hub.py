"""Hugging Face ids, GGUF repos and URLs read by header only, the hub cache and Ollama's store, against a fake hub on
127.0.0.1 that the real huggingface_hub client talks to (HF_ENDPOINT). Every expected byte count is derived here
by hand from the tensor shapes the test itself writes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_hub import FakeHub, Fault

from rsplan.errors import ModelFileError
from rsplan.hparams.gguf_file import read_gguf
from rsplan.hparams.hf_config import read_hf_config
from rsplan.hparams.hub import choose_gguf, parse_hub_ref, safe_repo_path, split_files
from rsplan.hparams.remote_gguf import FIRST_READ
from rsplan.hparams.sources import read_model

pytest.importorskip("huggingface_hub")

REAL = Path(__file__).parent / "real_configs"
MAMBA2_CONFIG = (REAL / "mamba2-130m" / "config.json").read_bytes()
LFM2_CONFIG = (REAL / "lfm2-700m" / "config.json").read_bytes()
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MAMBA2_KV: dict[str, Any] = {
    "context_length": 1 << 20, "embedding_length": 64, "block_count": 2, "feed_forward_length": 0,
    "attention.head_count": 0, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
    "ssm.time_step_rank": 8, "ssm.group_count": 2,
}
# (name, numpy-order shape, ggml type): 256 x 4096 q4_k = 256 rows * 16 blocks * 144 B = 589,824 per tensor
BIG_TENSORS = [(f"blk.{i}.w", (256, 4096), "q4_k") for i in range(4)]
BIG_BYTES = 4 * 256 * 16 * 144


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running fake hub, and an environment that points only at it (an empty cache, no token, no offline)."""
    server = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "3")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    yield server
    server.close()


def safetensors(tensors: list[tuple[str, str, list[int], int]], path: Path | None = None) -> bytes | Path:
    """A safetensors file of ``(name, dtype, shape, bytes)``; with ``path``, written there with the data as a hole."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, n in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    head = struct.pack("<Q", len(raw)) + raw
    if path is None:
        return head + bytes(offset)
    path.write_bytes(head)
    with path.open("r+b") as fh:
        fh.truncate(len(head) + offset)
    return path


def cache_entries(tmp_path: Path) -> list[str]:
    root = tmp_path / "hf-cache"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# -- config.json repositories ---------------------------------------------------------------------------------------


def _sharded_repo(hub: FakeHub, tmp_path: Path, repo: str = "state-spaces/mamba2-130m", config: bytes = MAMBA2_CONFIG,
                  **kw: Any) -> int:
    """config.json, an index and two shards (one an LFS-sized sparse file): returns the weights' bytes."""
    # shard 1: 50277 x 768 BF16 embedding (77,225,472 B, > LFS_MIN: served through the /cdn/ redirect) + F32 norm
    big = safetensors([("backbone.embeddings.weight", "BF16", [50277, 768], 50277 * 768 * 2),
                       ("backbone.norm_f.weight", "F32", [768], 768 * 4)], tmp_path / "shard1.safetensors")
    small = safetensors([("backbone.layers.0.mixer.A_log", "F32", [24], 24 * 4),
                         ("backbone.layers.0.mixer.in_proj.weight", "F8_E4M3", [3352, 768], 3352 * 768)])
    index = {"metadata": {"total_size": 0}, "weight_map": {
        "backbone.embeddings.weight": "model-00001-of-00002.safetensors",
        "backbone.norm_f.weight": "model-00001-of-00002.safetensors",
        "backbone.layers.0.mixer.A_log": "model-00002-of-00002.safetensors",
        "backbone.layers.0.mixer.in_proj.weight": "model-00002-of-00002.safetensors"}}
    hub.add(repo, {"config.json": config, "model.safetensors.index.json": json.dumps(index).encode(),
                   "model-00001-of-00002.safetensors": big, "model-00002-of-00002.safetensors": small,
                   "README.md": b"# a model\n"}, **kw)
    return 50277 * 768 * 2 + 768 * 4 + 24 * 4 + 3352 * 768


def test_config_repo_weights_exact_from_headers_only(hub: FakeHub, tmp_path: Path) -> None:
    total = _sharded_repo(hub, tmp_path)
    read = read_model("state-spaces/mamba2-130m")
    assert read.kind == "hf"
    assert read.spec.weights_bytes == total
    assert read.facts["weights_by_dtype"] == {"BF16": 50277 * 768 * 2, "F32": 768 * 4 + 24 * 4,
                                              "F8_E4M3": 3352 * 768}
    # the hyper-parameters are exactly the local directory's (config.json and the index beside it)
    local = tmp_path / "mamba2-130m"
    local.mkdir()
    (local / "config.json").write_bytes(MAMBA2_CONFIG)
    index = hub.repos["state-spaces/mamba2-130m"].files["model.safetensors.index.json"]
    assert isinstance(index, bytes)
    (local / "model.safetensors.index.json").write_bytes(index)
    expected = read_hf_config(local).spec
    # this index lists no lm_head.weight: the converter writes no output.weight (llama.cpp reuses token_embd)
    assert read.spec.tie_word_embeddings is True
    assert read.spec.model_dump(exclude={"source", "weights_bytes"}) == expected.model_dump(
        exclude={"source", "weights_bytes"})
    assert read.spec.source.startswith(f"hf.co/state-spaces/mamba2-130m@{COMMIT} config.json, weights from the ")
    # each shard cost one range request of the first 64 KiB (the header), never the 77 MB of data
    origin = read.facts["origin"]
    shards = [f for f in origin["files"] if f["path"].endswith(".safetensors")]
    assert [(f["bytes_fetched"], f["requests"]) for f in shards] == [(65536, 1), (65536, 1)]
    assert hub.bytes_sent("model-00001-of-00002.safetensors") == 65536
    assert hub.bytes_sent("model-00002-of-00002.safetensors") == 65536
    assert origin["revision"] == COMMIT and origin["listing"] == "hub API"
    # config.json and the index went into the hub cache; the weights did not
    assert [e for e in cache_entries(tmp_path) if "/snapshots/" in e] == [
        f"models--state-spaces--mamba2-130m/snapshots/{COMMIT}/config.json",
        f"models--state-spaces--mamba2-130m/snapshots/{COMMIT}/model.safetensors.index.json"]
    assert sum((tmp_path / "hf-cache" / e).stat().st_size for e in cache_entries(tmp_path)) < 4096


def test_hub_id_estimates_as_the_local_config(hub: FakeHub, tmp_path: Path, estimate_json: Any,
                                             rsplan: Any) -> None:
    total = _sharded_repo(hub, tmp_path, repo="LiquidAI/LFM2-700M", config=LFM2_CONFIG)
    local = tmp_path / "LFM2-700M"
    local.mkdir()
    (local / "config.json").write_bytes(LFM2_CONFIG)
    # llama.cpp's plan: the same as from the local config.json (both sized at the default Q4_K_M: the checkpoint's
    # safetensors bytes the hub id knows are what vLLM loads, not llama.cpp)
    remote_plan, local_plan = (estimate_json(m, "-c", "8192") for m in ("LiquidAI/LFM2-700M", local))
    breakdown_keys = {"breakdown", "notes", "output_buffer", "compute", "mtp_draft", "server_host"}
    assert {k: v for k, v in remote_plan.items() if k not in breakdown_keys} == {
        k: v for k, v in local_plan.items() if k not in breakdown_keys}
    # both sized tensor by tensor (the hub's index also says the output is tied, so its file is one matrix smaller)
    assert remote_plan["model_bytes_exact"] and local_plan["model_bytes_exact"]
    def context(plan: dict[str, Any]) -> list[int]:
        # the caches' buffers (the weights' CPU_Mapped / CPU_REPACK rows hold no context)
        return [r["context_bytes"] for r in plan["breakdown"] if r["buffer_type"] not in ("CPU_Mapped", "CPU_REPACK")]

    assert context(remote_plan) == context(local_plan)
    assert estimate_json("LiquidAI/LFM2-700M", "--engine", "vllm") == estimate_json(local, "--engine", "vllm")
    # vLLM's budget: the hub's real weight bytes (safetensors headers); a bare config.json is sized as the checkpoint
    # in its dtype
    remote, here = (json.loads(rsplan("capacity", "--model", str(m), "--engine", "vllm", "--budget", "80GiB",
                                      "--format", "json").output) for m in ("LiquidAI/LFM2-700M", local))
    weights = {f["label"]: f for f in remote["facts"]}["weights per GPU"]
    assert weights["value"] == total
    # LFM2-700M by hand (hidden 1536, 16 layers: 6 attention of 24 / 8 heads of 64, 10 short-conv with L_cache 3;
    # SwiGLU width 10240 * 2 / 3 = 6826, rounded up to 256: 6912; vocab 65536; config.json does not say the head
    # is tied, so the output head is counted beside the embedding), in bf16 elements:
    elements = (2 * 65536 * 1536 + 1536 + 16 * 2 * 1536
                + 6 * (2 * 1536 * 1536 + 2 * 512 * 1536 + 2 * 64)
                + 10 * (3 * 1536 * 1536 + 1536 * 3 + 1536 * 1536)
                + 16 * 3 * 6912 * 1536)
    local_weights = {f["label"]: f for f in here["facts"]}["weights per GPU"]
    assert local_weights["value"] == 2 * elements == 1_686_305_280
    assert local_weights["note"].endswith("(the output head counted: the config does not say it is tied)")


def test_revision_and_cache_reuse_offline(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _sharded_repo(hub, tmp_path)
    assert read_model(f"state-spaces/mamba2-130m@{COMMIT}").spec.weights_bytes is not None
    with pytest.raises(ModelFileError, match=r"no revision 'v9'"):
        read_model("state-spaces/mamba2-130m@v9")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.requests)
    read = read_model(f"state-spaces/mamba2-130m@{COMMIT}")
    assert len(hub.requests) == n  # nothing fetched offline
    assert read.facts["origin"]["listing"] == "cache"
    assert read.spec.weights_bytes is None  # the shards are not in the cache: unknown, and said so
    assert "not in the cache" in read.facts["origin"]["notes"][0]


def test_offline_with_an_empty_cache(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     rsplan: Any) -> None:
    _sharded_repo(hub, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = rsplan("estimate", "--model", "state-spaces/mamba2-130m")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "Traceback" not in r.output
    assert "not in the Hugging Face cache" in r.output and "HF_HUB_OFFLINE" in r.output
    assert hub.requests == [] and cache_entries(tmp_path) == []


# -- GGUF repositories and URLs -------------------------------------------------------------------------------------


def _gguf_repo(hub: FakeHub, tmp_path: Path, gguf_file: Any, repo: str = "unsloth/Tiny-GGUF", **kw: Any) -> Path:
    q4 = gguf_file("mamba2", MAMBA2_KV, filename="Tiny-Q4_K_M.gguf", tensors=BIG_TENSORS, name="tiny")
    q8 = gguf_file("mamba2", {**MAMBA2_KV, "block_count": 3}, filename="Tiny-Q8_0.gguf", tensors=BIG_TENSORS[:1])
    hub.add(repo, {"Tiny-Q4_K_M.gguf": q4, "Tiny-Q8_0.gguf": q8, "mmproj-Tiny-Q4_K_M.gguf": q8,
                   "README.md": b"hi"}, **kw)
    return q4


def test_gguf_repo_by_tag_reads_the_header_only(hub: FakeHub, tmp_path: Path, gguf_file: Any) -> None:
    q4 = _gguf_repo(hub, tmp_path, gguf_file)
    assert q4.stat().st_size > FIRST_READ  # so reading the header only is visible
    read = read_model("unsloth/Tiny-GGUF:q4_k_m")
    assert read.kind == "gguf"
    assert read.spec.weights_bytes == BIG_BYTES
    assert read.spec.model_dump(exclude={"source"}) == read_gguf(q4).spec.model_dump(exclude={"source"})
    origin = read.facts["origin"]
    assert [f["path"] for f in origin["files"]] == ["Tiny-Q4_K_M.gguf"]
    assert origin["bytes_fetched"] == FIRST_READ == hub.bytes_sent("Tiny-Q4_K_M.gguf")
    assert read_model("unsloth/Tiny-GGUF:Q8_0").spec.block_count == 3
    assert read_model("hf.co/unsloth/Tiny-GGUF").spec.block_count == 2  # no tag: Q4_K_M first, as llama.cpp
    assert cache_entries(tmp_path) == []  # header reads leave nothing in the cache
    with pytest.raises(ModelFileError, match=r"no GGUF file matches the tag 'Q2_K'"):
        read_model("unsloth/Tiny-GGUF:Q2_K")


def test_split_gguf_in_a_folder_summed(hub: FakeHub, tmp_path: Path, gguf_file: Any) -> None:
    first = gguf_file("mamba2", MAMBA2_KV, filename="Big-Q8_0.gguf", tensors=BIG_TENSORS, split_max_tensors=2)
    parts = sorted(first.parent.glob("Big-Q8_0-0000*-of-00002.gguf"))
    assert [p.name for p in parts] == ["Big-Q8_0-00001-of-00002.gguf", "Big-Q8_0-00002-of-00002.gguf"]
    hub.add("org/Big-GGUF", {f"Q8_0/{p.name}": p for p in parts})
    read = read_model("org/Big-GGUF:Q8_0")
    assert read.spec.weights_bytes == BIG_BYTES == read_gguf(parts[0]).spec.weights_bytes
    assert [f["path"] for f in read.facts["origin"]["files"]] == [f"Q8_0/{p.name}" for p in parts]
    assert len(read.facts["files"]) == 2


def test_gguf_url(hub: FakeHub, tmp_path: Path, gguf_file: Any, rsplan: Any) -> None:
    q4 = _gguf_repo(hub, tmp_path, gguf_file)
    url = f"{hub.url}/unsloth/Tiny-GGUF/resolve/main/Tiny-Q4_K_M.gguf"
    read = read_model(url)
    assert read.spec.weights_bytes == BIG_BYTES and read.facts["origin"]["form"] == "url"
    assert read.facts["origin"]["bytes_fetched"] == FIRST_READ
    assert read.spec.model_dump(exclude={"source"}) == read_gguf(q4).spec.model_dump(exclude={"source"})
    r = rsplan("inspect", "--model", url)
    assert r.exit_code == 0, r.output
    assert f"read by range from {url}: {FIRST_READ:,} bytes fetched in 1 request" in " ".join(r.output.split())


def test_large_vocabulary_header_grows_by_doubling(hub: FakeHub, gguf_file: Any) -> None:
    # 80,000 tokens of 9 to 14 bytes (each after its 8-byte length): a header of ~1.6 MB, read as a prefix of
    # 1 MiB, then of 2 MiB
    tokens = [f"tok{i:06d}" + "x" * (i % 6) for i in range(80_000)]
    path = gguf_file("mamba2", {**MAMBA2_KV, "general.tokens": tokens}, filename="Voc-Q4_K_M.gguf",
                     tensors=BIG_TENSORS)
    header_end = read_gguf(path).index.data_offset
    hub.add("org/Voc-GGUF", {"Voc-Q4_K_M.gguf": path})
    read = read_model("org/Voc-GGUF")
    fetched = read.facts["origin"]["bytes_fetched"]
    assert FIRST_READ < header_end <= fetched <= 2 * header_end and fetched == 2 * FIRST_READ
    assert read.facts["origin"]["requests"] == 2


def test_tag_resolution_mirrors_llama_cpp() -> None:
    files = ["README.md", "mmproj-M-Q4_K_M.gguf", "M-IQ2_XS.gguf", "M-Q8_0.gguf", "M-Q4_K_M.gguf",
             "BF16/M-BF16-00001-of-00002.gguf", "BF16/M-BF16-00002-of-00002.gguf", "M-imatrix.gguf"]
    assert choose_gguf(files, None) == "M-Q4_K_M.gguf"
    assert choose_gguf([f for f in files if "Q4_K_M" not in f], None) == "M-Q8_0.gguf"
    assert choose_gguf(["a.gguf", "mmproj-a.gguf"], None) == "a.gguf"  # the first model file, with no tag
    assert choose_gguf(files, "q8_0") == "M-Q8_0.gguf"  # any case
    assert choose_gguf(files, "BF16") == "BF16/M-BF16-00001-of-00002.gguf"  # a first part only
    assert split_files(files, "BF16/M-BF16-00001-of-00002.gguf") == files[5:7]
    assert choose_gguf(files, "Q2_K") is None  # a tag that matches nothing is not replaced by another file
    assert choose_gguf(["M-Q4_K_MX.gguf"], "Q4_K_M") is None  # the tag must end at '.' or '-'
    assert parse_hub_ref("org/name@rev:Q4_K_M") is not None and parse_hub_ref("./x/y") is None
    assert parse_hub_ref("org/..") is None
    assert safe_repo_path("Q8_0/M-Q8_0.gguf") and not safe_repo_path("../../etc/passwd")
    assert not safe_repo_path("/abs.gguf") and not safe_repo_path("a/./b") and not safe_repo_path("a\\b")


# -- faults: one line, no traceback, nothing half-written ------------------------------------------------------------


def _one_line_error(rsplan: Any, ref: str, *expect: str) -> str:
    r = rsplan("estimate", "--model", ref)
    assert r.exit_code == 1, r.output
    assert r.output.startswith("Error: ") and r.output.count("\n") == 1, r.output
    for text in expect:
        assert text in r.output, r.output
    return r.output


def test_not_found_and_gated(hub: FakeHub, tmp_path: Path, gguf_file: Any, rsplan: Any,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    _one_line_error(rsplan, "nobody/nothing", "nobody/nothing")
    _gguf_repo(hub, tmp_path, gguf_file, repo="org/Gated-GGUF", gated=True)
    _one_line_error(rsplan, "org/Gated-GGUF:Q4_K_M", "gated", "HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert read_model("org/Gated-GGUF:Q4_K_M").spec.weights_bytes == BIG_BYTES
    assert cache_entries(tmp_path) == []


def test_retries_are_bounded(hub: FakeHub, tmp_path: Path, gguf_file: Any, rsplan: Any,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rsplan.hparams.remote.MAX_WAIT_S", 0.01)
    _gguf_repo(hub, tmp_path, gguf_file)
    hub.faults["Tiny-Q4_K_M.gguf"] = Fault("status", status=429, times=2, headers={"Retry-After": "0"})
    assert read_model("unsloth/Tiny-GGUF").spec.weights_bytes == BIG_BYTES  # the third try
    hub.faults["Tiny-Q4_K_M.gguf"] = Fault("status", status=503, headers={"Retry-After": "0"})
    before = sum(1 for r in hub.requests if r[1].endswith("Tiny-Q4_K_M.gguf"))
    _one_line_error(rsplan, "unsloth/Tiny-GGUF", "HTTP 503", "3 tries")
    assert sum(1 for r in hub.requests if r[1].endswith("Tiny-Q4_K_M.gguf")) - before == 3
    hub.faults["api:unsloth/Tiny-GGUF"] = Fault("status", status=500)
    _one_line_error(rsplan, "unsloth/Tiny-GGUF", "HTTP 500")


def test_stall_times_out(hub: FakeHub, tmp_path: Path, gguf_file: Any, rsplan: Any,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.3")
    _gguf_repo(hub, tmp_path, gguf_file)
    hub.faults["Tiny-Q4_K_M.gguf"] = Fault("stall", seconds=3)
    start = time.monotonic()
    _one_line_error(rsplan, "unsloth/Tiny-GGUF", "timed out")
    assert time.monotonic() - start < 2.5


def test_truncated_answer_and_redirect_loop(hub: FakeHub, tmp_path: Path, gguf_file: Any, rsplan: Any) -> None:
    _gguf_repo(hub, tmp_path, gguf_file)
    hub.faults["Tiny-Q4_K_M.gguf"] = Fault("truncate", keep=100)
    _one_line_error(rsplan, "unsloth/Tiny-GGUF", "truncated")
    hub.faults["Tiny-Q4_K_M.gguf"] = Fault("loop")
    _one_line_error(rsplan, "unsloth/Tiny-GGUF", "redirect")


def test_server_ignoring_range_is_read_no_further(hub: FakeHub, tmp_path: Path, gguf_file: Any) -> None:
    _gguf_repo(hub, tmp_path, gguf_file)
    hub.faults["Tiny-Q4_K_M.gguf"] = Fault("no_range")
    read = read_model("unsloth/Tiny-GGUF")
    assert read.spec.weights_bytes == BIG_BYTES and read.facts["origin"]["bytes_fetched"] == FIRST_READ


def test_hostile_header_costs_one_read(hub: FakeHub, rsplan: Any) -> None:
    # GGUF v3 claiming 10^12 tensors, then zeros, in a "file" of 10 MB
    hostile = b"GGUF" + struct.pack("<IQQ", 3, 10**12, 1) + bytes(10_000_000 - 24)
    hub.add("evil/Evil-GGUF", {"Evil-Q4_K_M.gguf": hostile})
    _one_line_error(rsplan, "evil/Evil-GGUF", "tensor_count", "more than the 65536 allowed")
    assert hub.bytes_sent("Evil-Q4_K_M.gguf") == FIRST_READ
    # a string length that runs past the file: refused without fetching more
    lying = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 10**15) + bytes(4000)
    hub.add("evil/Lying-GGUF", {"L-Q4_K_M.gguf": lying})
    _one_line_error(rsplan, "evil/Lying-GGUF", "string of 1000000000000000 bytes, more than the 65536 allowed")


def test_bad_safetensors_header_is_one_line(hub: FakeHub, rsplan: Any) -> None:
    bad = safetensors([("w", "BF16", [10, 10], 100)])  # 100 bytes where 10 x 10 BF16 needs 200
    hub.add("org/bad", {"config.json": MAMBA2_CONFIG, "model.safetensors": bad})
    _one_line_error(rsplan, "org/bad", "100 bytes of data for shape [10, 10] of BF16")
    huge = struct.pack("<Q", 10**12) + bytes(100)
    hub.add("org/huge", {"config.json": MAMBA2_CONFIG, "model.safetensors": huge})
    _one_line_error(rsplan, "org/huge", "safetensors header of 1000000000000 bytes")


# -- the CLI end to end -----------------------------------------------------------------------------------------------


def test_commands_take_hub_ids(hub: FakeHub, tmp_path: Path, gguf_file: Any, rsplan: Any) -> None:
    total = _sharded_repo(hub, tmp_path)
    _gguf_repo(hub, tmp_path, gguf_file)
    r = rsplan("inspect", "--model", "state-spaces/mamba2-130m")
    assert r.exit_code == 0, r.output
    assert f"Hugging Face repo state-spaces/mamba2-130m at revision {COMMIT}" in r.output
    text = " ".join(r.output.split())  # the renderer wraps long lines at 120 columns
    assert "model-00001-of-00002.safetensors: " in text and "65,536 bytes fetched in 1 request" in text
    assert f"{total:,}" in r.output
    j = json.loads(rsplan("inspect", "--model", "unsloth/Tiny-GGUF:Q4_K_M", "--format", "json").output)
    assert j["input"]["origin"]["files"][0]["bytes_fetched"] == FIRST_READ
    r = rsplan("capacity", "--model", "unsloth/Tiny-GGUF:Q4_K_M", "--budget", "8GiB", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["weights_bytes"] == BIG_BYTES
    out = tmp_path / "r.html"
    r = rsplan("report", "--model", "state-spaces/mamba2-130m", "--budget", "8GiB", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 0


# -- Ollama's store ---------------------------------------------------------------------------------------------------


def _ollama_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gguf: Path, name: list[str], tag: str,
                  size: int | None = None) -> Path:
    models = tmp_path / "ollama"
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, models / "blobs" / f"sha256-{digest}")
    manifest = models.joinpath("manifests", *name, tag)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
         "size": gguf.stat().st_size if size is None else size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10}]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    return manifest


def test_ollama_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gguf_file: Any, rsplan: Any) -> None:
    gguf = gguf_file("mamba2", MAMBA2_KV, filename="t.gguf")
    _ollama_store(tmp_path, monkeypatch, gguf, ["registry.ollama.ai", "library", "tiny"], "latest")
    read = read_model("ollama:tiny")
    assert read.spec.model_dump(exclude={"source"}) == read_gguf(gguf).spec.model_dump(exclude={"source"})
    assert read.facts["origin"]["form"] == "ollama"
    _ollama_store(tmp_path, monkeypatch, gguf, ["hf.co", "unsloth", "Tiny-GGUF"], "Q4_K_M")
    assert read_model("ollama:hf.co/unsloth/Tiny-GGUF:Q4_K_M").spec.block_count == 2
    _one_line_error(rsplan, "ollama:tiny:7b", "not in the Ollama store", "ollama pull tiny:7b")
    _ollama_store(tmp_path, monkeypatch, gguf, ["registry.ollama.ai", "library", "short"], "latest", size=1)
    _one_line_error(rsplan, "ollama:short", "the manifest says 1")


def test_a_preset_estimate_imports_no_hub_client() -> None:
    code = (
        "import sys; from rsplan.cli import main\n"
        "sys.argv = ['rsplan', 'estimate', '--model', 'qwen3-next-80b-a3b', '-c', '8192']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('huggingface_hub', 'httpx', 'httpx2', 'hf_xet')\n"
        "             or m.startswith(('rsplan.hparams.hub', 'rsplan.hparams.remote'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_gguf_in_the_cache_is_read_offline(hub: FakeHub, tmp_path: Path, gguf_file: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    q4 = gguf_file("mamba2", MAMBA2_KV, filename="Tiny-Q4_K_M.gguf", tensors=BIG_TENSORS)
    repo = tmp_path / "hf-cache" / "models--unsloth--Tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    shutil.copyfile(q4, repo / "snapshots" / COMMIT / "Tiny-Q4_K_M.gguf")  # as llama.cpp -hf leaves it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    read = read_model("unsloth/Tiny-GGUF:Q4_K_M")
    assert read.spec.weights_bytes == BIG_BYTES and hub.requests == []
    assert read.facts["origin"]["listing"] == "cache" and read.facts["origin"]["files"][0]["from"] == "cache"


def test_model_directory_weights_from_local_headers(tmp_path: Path) -> None:
    model = tmp_path / "mamba2-130m"
    model.mkdir()
    (model / "config.json").write_bytes(MAMBA2_CONFIG)
    safetensors([("a", "BF16", [50277, 768], 50277 * 768 * 2), ("b", "F32", [768], 768 * 4)],
                model / "model.safetensors")
    read = read_model(str(model))
    assert read.spec.weights_bytes == 50277 * 768 * 2 + 768 * 4
    assert read.facts["weights_by_dtype"] == {"BF16": 50277 * 768 * 2, "F32": 768 * 4}
    with (model / "model.safetensors").open("r+b") as fh:  # a download cut short
        fh.truncate(1000)
    with pytest.raises(ModelFileError, match=r"the file has 1000: truncated or corrupt"):
        read_model(str(model))
    # a clone without git-lfs: pointer files, so the weights are unknown (and said so), the caches still sized
    (model / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    read = read_model(str(model))
    assert read.spec.weights_bytes is None and "git-lfs" in read.facts["origin"]["notes"][0]


def test_truncated_config_download_leaves_no_cache_entry(hub: FakeHub, tmp_path: Path, rsplan: Any) -> None:
    _sharded_repo(hub, tmp_path)
    hub.faults["config.json"] = Fault("truncate", keep=10)
    _one_line_error(rsplan, "state-spaces/mamba2-130m", "config.json", "truncated")
    # the index, read whole before the config, is stored; nothing of the config.json, and no temporary file
    snapshot = f"models--state-spaces--mamba2-130m/snapshots/{COMMIT}"
    assert cache_entries(tmp_path) == ["models--state-spaces--mamba2-130m/refs/main",
                                       f"{snapshot}/model.safetensors.index.json"]
    assert (tmp_path / "hf-cache" / snapshot / "model.safetensors.index.json").read_bytes() == hub.repos[
        "state-spaces/mamba2-130m"].files["model.safetensors.index.json"]


def test_token_goes_to_the_hub_only(hub: FakeHub, tmp_path: Path, gguf_file: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _gguf_repo(hub, tmp_path, gguf_file, repo="org/Gated-GGUF", gated=True)
    hub.cdn_host = "localhost"  # another origin than the hub's 127.0.0.1
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert read_model("org/Gated-GGUF:Q4_K_M").spec.weights_bytes == BIG_BYTES
    seen = {path: auth for path, auth in hub.auth_seen.items() if path.endswith("Tiny-Q4_K_M.gguf")}
    assert seen == {f"/org/Gated-GGUF/resolve/{COMMIT}/Tiny-Q4_K_M.gguf": f"Bearer {hub.token}",
                    f"/cdn/org/Gated-GGUF/resolve/{COMMIT}/Tiny-Q4_K_M.gguf": None}
    # a GGUF URL on another host than HF_ENDPOINT gets no token at all
    hub.add("org/Open-GGUF", {"O-Q4_K_M.gguf": gguf_file("mamba2", MAMBA2_KV, filename="O-Q4_K_M.gguf")})
    read_model(f"http://localhost:{hub.url.rsplit(':', 1)[1]}/org/Open-GGUF/resolve/main/O-Q4_K_M.gguf")
    assert hub.auth_seen["/org/Open-GGUF/resolve/main/O-Q4_K_M.gguf"] is None


def test_safetensors_header_checks() -> None:
    from rsplan.hparams.safetensors_header import parse_header

    def header(tensors: dict[str, Any]) -> bytes:
        return json.dumps(tensors).encode()

    raw = header({"a": {"dtype": "F4", "shape": [4, 3], "data_offsets": [0, 6]},  # 12 x 4 bits
                  "b": {"dtype": "I64", "shape": [], "data_offsets": [6, 14]}})
    ok = parse_header(raw, "f", 8 + len(raw) + 14)
    assert ok.dtype_bytes == {"F4": 6, "I64": 8} and ok.data_bytes == 14
    bad = {
        "gap": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, "starts at data byte 2, expected 0"),
        "overlap": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                     "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, "starts at data byte 1, expected 2"),
        "dtype": ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, 'dtype "Q4" is not'),
        "shape": ({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, "is not a list of dimensions"),
        "offsets": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}}, "is not [begin, end]"),
        "object": ({"a": [1]}, "expected an object"),
    }
    for case, (tensors, message) in bad.items():
        with pytest.raises(ModelFileError, match=re.escape(message)):
            parse_header(header(tensors), case)
    with pytest.raises(ModelFileError, match="not a JSON object"):
        parse_header(b"[1]", "list")
    with pytest.raises(ModelFileError, match="invalid JSON"):
        parse_header(b'{"a": 1, "a": 2}', "dup")


def test_ollama_names_and_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gguf_file: Any) -> None:
    from rsplan.hparams.ollama import manifest_path

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "m"))
    assert manifest_path("qwen3") == tmp_path / "m/manifests/registry.ollama.ai/library/qwen3/latest"
    assert manifest_path("me/mine:q4") == tmp_path / "m/manifests/registry.ollama.ai/me/mine/q4"
    for bad in ("../x", "a/../../b", "x:y:z", "a:", "/abs"):
        with pytest.raises(ModelFileError, match="expected"):
            manifest_path(bad)
    gguf = gguf_file("mamba2", MAMBA2_KV, filename="t.gguf")
    manifest = _ollama_store(tmp_path, monkeypatch, gguf, ["registry.ollama.ai", "library", "two"], "latest")
    data = json.loads(manifest.read_text())
    data["layers"].append(dict(data["layers"][0]))
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelFileError, match=r"2 layers of type application/vnd\.ollama\.image\.model, expected 1"):
        read_model("ollama:two")
