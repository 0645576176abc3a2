"""Resolve ``--model`` to a ModelSpec: a built-in preset name, a preset YAML, a GGUF file, a Hugging Face
config.json / model directory, a Hugging Face model id (``ORG/NAME[@REVISION][:QUANT]``), a GGUF URL, or an
Ollama model (``ollama:NAME[:TAG]``). Heavy readers (gguf, numpy, huggingface_hub) are imported only for the
inputs that need them; a built-in preset imports none of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import rsplan.presets
from rsplan.errors import ModelFileError, either, excerpt, printable
from rsplan.files import open_regular, path_kind
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.yaml_preset import load_preset_file, load_trusted_preset_text, read_text_file

GGUF_MAGIC = b"GGUF"


def presets_dir() -> Path:
    """The folder of the built-in presets (a regular package directory, in a wheel and in a checkout)."""
    return Path(rsplan.presets.__file__).parent


def builtin_preset_names() -> list[str]:
    """Names of the presets shipped in rsplan.presets, sorted."""
    return sorted(p.name[:-5] for p in presets_dir().iterdir() if p.name.endswith(".yaml"))


#: A built-in preset name: the stem of a file in rsplan/presets.
_PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

ModelKind = Literal["preset", "yaml", "gguf", "hf"]


def builtin_preset_path(name: str) -> Path:
    """The YAML file of built-in preset ``name``; a ModelFileError if there is none."""
    path = presets_dir() / f"{name}.yaml"
    if not _PRESET_NAME.match(name) or path_kind(path) != "file":
        shown = excerpt(name)
        close = closest_presets(name)
        hint = f"; did you mean {either(close)}?" if close else ""
        raise ModelFileError(f"no built-in preset named '{shown}'{hint} (see `rsplan presets list`)")
    return path


def closest_presets(name: str, n: int = 3) -> list[str]:
    """The built-in presets ``name`` most likely meant: those it begins (``qwen3-next`` ->
    ``qwen3-next-80b-a3b``), then the closest spellings; at most ``n``."""
    import difflib  # deferred: difflib, for a mistyped preset name only (start-up time: rsplan estimate)

    if len(name) > 200:
        return []
    names = builtin_preset_names()
    key = name.lower()
    starts = [p for p in names if p.lower().startswith(key)] if len(key) >= 3 else []

    similar = difflib.get_close_matches(key, [p.lower() for p in names], n=n, cutoff=0.6)
    by_lower = {p.lower(): p for p in names}
    return list(dict.fromkeys([*starts, *(by_lower[s] for s in similar)]))[:n]


def load_builtin_preset(name: str) -> ModelSpec:
    """A built-in preset, read as trusted data (``ModelSpec.from_trusted``: no pydantic schema is built; the test
    suite validates every shipped preset against the schema)."""
    path = builtin_preset_path(name)
    return load_trusted_preset_text(path.read_text(encoding="utf-8"), f"preset {name}")


def _looks_like_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open_regular(path) as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False  # not sniffable: the preset reader names the problem


def resolve_model(ref: str) -> tuple[ModelKind, Path]:
    """What ``--model REF`` names, without reading it.

    A path that exists is a file or a directory: a directory or a ``.json`` file is a Hugging Face config, a
    file is GGUF by its magic or suffix, otherwise preset YAML. Anything else must be a built-in preset name
    (``("preset", <its YAML file>)``).

    Raises:
        ModelFileError: an empty reference, a path that is not a regular file or directory (FIFO, device), a
            path that cannot be looked at (name too long, permission), a missing file, or an unknown preset.
    """
    if not ref.strip():
        raise ModelFileError("--model is empty: give a built-in preset name (see `rsplan presets list`) or a file")
    path = Path(ref)
    try:
        kind = path_kind(path)
    except OSError as exc:
        raise ModelFileError(f"{ref}: cannot read: {exc.strerror or exc}") from None
    if kind == "dir":
        return "hf", path
    if kind == "file":
        if _looks_like_gguf(path):
            return "gguf", path
        return ("hf", path) if path.suffix.lower() == ".json" else ("yaml", path)
    if kind == "other":
        raise ModelFileError(f"{ref}: not a regular file or directory")
    if "/" in ref or "\\" in ref or ref.lower().endswith((".yaml", ".yml", ".gguf", ".json")):
        raise ModelFileError(f"{printable(ref)}: no such file")
    return "preset", builtin_preset_path(ref)


@dataclass
class ReadModel:
    """A model read for sizing, with where each fact came from.

    Attributes:
        spec: the model.
        kind: "gguf" (a GGUF header), "hf" (a config.json) or "preset".
        sources: spec field -> where it was read from.
        facts: input-specific facts (GGUF version and tensor table, the converter, safetensors bytes per dtype)
            and ``origin``: how the reference was resolved (file, URL, repo and revision, bytes fetched).
        tensors: a local single-file GGUF's tensor table, (name, ggml_nbytes) per tensor, for exact model bytes;
            None for other inputs.
        tensor_rows: the same tensors' (ggml type name, ``ne[0]``), for device buffers' row padding.
        tensor_shapes: the same tensors' shapes (ne0 first), for the CPU's repacking.
        tensor_alignment: the file's data alignment: with the table, where each tensor lies (a CPU_Mapped span).
    """

    spec: ModelSpec
    kind: str
    sources: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    tensors: tuple[tuple[str, int], ...] | None = None
    tensor_rows: tuple[tuple[str, int], ...] | None = None
    tensor_shapes: tuple[tuple[int, ...], ...] | None = None
    tensor_alignment: int = 32


def _gguf_read(g: Any, origin: dict[str, Any]) -> ReadModel:
    facts = {
        "gguf_version": g.index.version,
        "n_tensors": g.index.n_tensors,
        "files": list(g.files),
        "tensor_bytes": dict(sorted(g.split_tensor_bytes.items())),
        "origin": origin,
    }
    return ReadModel(g.spec, "gguf", g.loaded.sources, facts)


def _hf_read(h: Any, origin: dict[str, Any], dtype_bytes: dict[str, int] | None = None) -> ReadModel:
    facts: dict[str, Any] = {"architecture": h.architecture, "model_type": h.model_type, "converter": h.converter,
                             "origin": origin}
    if dtype_bytes is not None:
        facts["weights_by_dtype"] = dtype_bytes
    if h.vocab_unknown is not None:
        facts["vocab_size_unknown"] = h.vocab_unknown
    if h.quant_method is not None:
        facts["quantization_config"] = h.quant_method
    if h.config_tied is not None:
        facts["tie_word_embeddings"] = h.config_tied
    return ReadModel(h.spec, "hf", h.loaded.sources, facts)


def _local_weights(directory: Path) -> tuple[dict[str, int], int, list[str]] | None:
    """Bytes per dtype from the safetensors headers of a local model directory (the index's shards, else
    model.safetensors, else every *.safetensors), tensors and files; None without safetensors files."""
    from rsplan.hparams import safetensors_header as st  # deferred: a model directory's reader (json, struct)
    from rsplan.hparams.hf_base import parse_json_text  # deferred: pydantic (llama_loader)
    from rsplan.hparams.hf_config import MAX_CONFIG_BYTES  # deferred: pydantic (the config.json reader)

    index = directory / "model.safetensors.index.json"
    if path_kind(index) == "file":
        data = parse_json_text(read_text_file(index, MAX_CONFIG_BYTES * 16), index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and "/" not in v and v not in (".", "..")
                                                       for v in weight_map.values()):
            raise ModelFileError(f"{index}: weight_map is not an object of file names")
        names = sorted(set(weight_map.values()))
    elif path_kind(directory / "model.safetensors") == "file":
        names = ["model.safetensors"]
    else:
        names = sorted(p.name for p in directory.glob("*.safetensors"))
    if not names or any(path_kind(directory / name) != "file" or st.is_lfs_pointer(directory / name)
                        for name in names):
        return None  # a config-only download or a clone without git-lfs: the weights stay unknown (inspect says so)
    dtype_bytes: dict[str, int] = {}
    n_tensors = 0
    for name in names:
        header = st.read_local(directory / name)
        n_tensors += header.n_tensors
        for dtype, n in header.dtype_bytes.items():
            dtype_bytes[dtype] = dtype_bytes.get(dtype, 0) + n
    return dict(sorted(dtype_bytes.items())), n_tensors, names


def _read_local_hf(path: Path) -> ReadModel:
    from rsplan.hparams.hf_config import read_hf_config  # deferred: pydantic (the config.json reader)
    from rsplan.hparams.llama_loader import LoadedModel  # deferred: pydantic

    h = read_hf_config(path)
    origin: dict[str, Any] = {"form": "file", "file": h.config_path}
    directory = path if path_kind(path) == "dir" else None
    weights = _local_weights(directory) if directory is not None else None
    if weights is None:
        origin["notes"] = ["no complete set of safetensors files beside the config (or git-lfs pointers only): "
                           "weights_bytes unknown"]
        return _hf_read(h, origin)
    dtype_bytes, n_tensors, names = weights
    sources = {**h.loaded.sources,
               "weights_bytes": f"safetensors headers ({n_tensors} tensors in {len(names)} files)"}
    spec = h.spec.model_copy(update={"weights_bytes": sum(dtype_bytes.values())})
    origin["weights_files"] = names
    h = replace(h, loaded=LoadedModel(type(spec).model_validate(spec.model_dump()), sources))
    return _hf_read(h, origin, dtype_bytes)


def _read_url(url: str) -> ReadModel:
    """A GGUF at an http(s) URL, read by its header (hparams.remote_gguf)."""
    # deferred: the remote-model modules (about 20 ms of imports that a preset estimate does not pay)
    from rsplan.hparams.hub import hub_env
    from rsplan.hparams.remote import FetchLog, RangeReader, shown_url
    from rsplan.hparams.remote_gguf import read_remote_gguf

    env = hub_env()
    if env.offline:
        raise ModelFileError(f"{shown_url(url)}: HF_HUB_OFFLINE is set: nothing is fetched (give a local file)")
    parts = urlsplit(url)
    name = parts.path.rsplit("/", 1)[-1]
    headers: dict[str, str] = {}
    on_hub = parts.netloc == urlsplit(env.endpoint).netloc
    if on_hub:
        from huggingface_hub.utils import build_hf_headers  # deferred: huggingface_hub

        headers = build_hf_headers(token=env.token)
    hint = "set HF_TOKEN to a token with access" if on_hub else ""
    logs: list[tuple[str, FetchLog]] = []

    def reader(u: str) -> RangeReader:
        log = FetchLog()
        logs.append((u, log))
        return RangeReader(u, headers, log, hint=hint)

    def part(part_name: str) -> RangeReader:
        base = url.split("?", 1)[0]
        return reader(base.rsplit("/", 1)[0] + "/" + part_name)

    g = read_remote_gguf(reader(url), name, part)
    origin: dict[str, Any] = {"form": "url", "files": [{"url": shown_url(u), "bytes_fetched": log.bytes_read,
                                        "requests": log.requests} for u, log in logs]}
    origin["bytes_fetched"] = sum(f["bytes_fetched"] for f in origin["files"])
    return _gguf_read(g, origin)


def _read_ollama(name: str) -> ReadModel:
    from rsplan.hparams.gguf_file import read_gguf  # deferred: the GGUF reader imports pydantic (llama_loader)
    from rsplan.hparams.ollama import resolve  # deferred: the Ollama store's reader (json)

    o = resolve(name)
    g = read_gguf(o.blob)
    read = _gguf_read(g, {"form": "ollama", "name": name, "manifest": str(o.manifest), "blob": str(o.blob),
                          "digest": o.digest})
    if read.spec.name == o.blob.name:  # no general.name: the Ollama name, not the blob's digest
        read.spec = read.spec.model_copy(update={"name": name[:200]})
    return read


def _read_hub(ref: Any) -> ReadModel:
    from rsplan.hparams.hub import read_hub  # deferred: the remote-model modules (about 20 ms)

    m = read_hub(ref)
    origin = m.origin.as_dict()
    if m.kind == "gguf":
        return _gguf_read(m.model, origin)
    return _hf_read(m.model, origin, m.dtype_bytes)


def read_model(ref: str) -> ReadModel:
    """The model ``--model REF`` names, with where each fact came from.

    An existing path, then ``ollama:NAME[:TAG]``, then an http(s) URL of a GGUF, then a Hugging Face model id
    ``[hf.co/]ORG/NAME[@REVISION][:QUANT]``, then a built-in preset name (see ``resolve_model`` for paths).
    """
    if ref.strip() and path_kind_safe(ref) == "missing":
        if ref.startswith("ollama:"):
            return _read_ollama(ref[len("ollama:"):])
        if ref.startswith(("https://", "http://")) and not re.match(r"^https?://(hf\.co|huggingface\.co)/[^/]+/[^/]+$",
                                                                 ref):
            if not ref.split("?", 1)[0].lower().endswith(".gguf"):
                raise ModelFileError(f"{printable(ref[:200])}: a URL must name a .gguf file")
            return _read_url(ref)
        # a hub id has an ORG/NAME slash; a built-in preset name has none and so never imports the hub reader
        if "/" in ref and not ref.lower().endswith((".yaml", ".yml", ".gguf", ".json")):
            from rsplan.hparams.hub import parse_hub_ref  # deferred: the remote-model modules (about 20 ms)

            hub_ref = parse_hub_ref(ref)
            if hub_ref is not None:
                return _read_hub(hub_ref)
    kind, path = resolve_model(ref)
    if kind == "gguf":
        from rsplan.hparams.gguf_file import read_gguf  # deferred: the GGUF reader imports pydantic (llama_loader)

        g = read_gguf(path)
        read = _gguf_read(g, {"form": "file", "file": str(path)})
        if len(g.files) == 1:
            read.tensors = g.index.tensors
            read.tensor_rows = g.index.tensor_rows
            read.tensor_shapes = g.index.tensor_shapes
            read.tensor_alignment = g.index.alignment
        return read
    if kind == "hf":
        return _read_local_hf(path)
    spec = load_preset_file(path) if kind == "yaml" else load_builtin_preset(ref)
    sources = {f: "preset" for f in _set_fields(spec)}
    return ReadModel(spec, "preset", sources, {"origin": {"form": kind, "file": str(path)}})


def path_kind_safe(ref: str) -> str:
    """path_kind of ``ref``, "error" where it cannot be looked at (resolve_model then names the problem)."""
    try:
        return path_kind(Path(ref))
    except (OSError, ValueError):
        return "error"


def _set_fields(spec: ModelSpec) -> list[str]:
    def flat(data: dict[str, Any], prefix: str = "") -> list[str]:
        out: list[str] = []
        for key, value in data.items():
            out += flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
        return out

    return flat(spec.model_dump(mode="json", exclude_none=True, exclude_unset=True))


def load_model(ref: str) -> ModelSpec:
    """The ModelSpec for ``--model REF`` (see ``read_model``)."""
    return read_model(ref).spec
