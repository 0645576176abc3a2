"""``--model ollama:NAME[:TAG]``: a model pulled with Ollama, from its local store, offline.

Ollama keeps a manifest per model and tag, ``<models>/manifests/<host>/<namespace>/<model>/<tag>`` (an OCI image
manifest: JSON with ``layers``), and the layers as ``<models>/blobs/sha256-<hex>``. The layer whose mediaType is
``application/vnd.ollama.image.model`` is the GGUF file, read as a local GGUF (``gguf_file.read_gguf``). ``<models>``
is OLLAMA_MODELS, else ``~/.ollama/models``. A NAME without a host is on ``registry.ollama.ai``, without a
namespace in ``library``; the TAG defaults to ``latest`` (``ollama:hf.co/ORG/REPO:Q4_K_M`` names a model Ollama
pulled from the hub).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError, printable
from rsplan.files import path_kind
from rsplan.hparams.yaml_preset import read_text_file

PREFIX = "ollama:"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
#: A manifest is a few hundred bytes.
MAX_MANIFEST = 1 << 20


@dataclass(frozen=True)
class OllamaModel:
    name: str  # as given, without the prefix
    manifest: Path
    blob: Path
    digest: str


def models_dir() -> Path:
    """OLLAMA_MODELS, else ~/.ollama/models."""
    return Path(os.path.expanduser(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models"))


def manifest_path(name: str) -> Path:
    """The manifest file of ``NAME[:TAG]`` (host registry.ollama.ai, namespace library and tag latest by default)."""
    if name.count(":") > 1 or name.endswith(":"):
        raise ModelFileError(f"ollama:{printable(name[:100])}: expected NAME[:TAG]")
    ref, _, tag = name.partition(":")
    tag = tag or "latest"
    parts = ref.split("/")
    if len(parts) == 1:
        parts = ["registry.ollama.ai", "library", *parts]
    elif len(parts) == 2:
        parts = ["registry.ollama.ai", *parts]
    if len(parts) < 3 or not all(_PART.match(p) for p in [*parts, tag]):
        raise ModelFileError(f"ollama:{printable(name[:100])}: expected ollama:[HOST/][NAMESPACE/]MODEL[:TAG]")
    return models_dir().joinpath("manifests", *parts, tag)


def resolve(name: str) -> OllamaModel:
    """The GGUF blob of the Ollama model ``name`` (``NAME[:TAG]``).

    Raises:
        ModelFileError: no such model in the store, an unreadable or malformed manifest, no model layer, a
            missing blob or one whose size is not the manifest's.
    """
    from rsplan.hparams.hf_base import parse_json_text  # deferred: pydantic (llama_loader)

    manifest = manifest_path(name)
    where = f"ollama:{printable(name)}"
    try:
        kind = path_kind(manifest)
    except OSError as exc:
        raise ModelFileError(f"{where}: {manifest}: cannot read: {exc.strerror or exc}") from None
    if kind != "file":
        raise ModelFileError(f"{where}: not in the Ollama store ({manifest} not found; OLLAMA_MODELS="
                             f"{models_dir()}); pull it with `ollama pull {printable(name)}`")
    data: Any = parse_json_text(read_text_file(manifest, MAX_MANIFEST), manifest)
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise ModelFileError(f"{manifest}: layers: expected a list of layers")
    models = [x for x in layers if isinstance(x, dict) and x.get("mediaType") == MODEL_MEDIA_TYPE]
    if len(models) != 1:
        raise ModelFileError(f"{manifest}: {len(models)} layers of type {MODEL_MEDIA_TYPE}, expected 1")
    layer = models[0]
    match = _DIGEST.match(str(layer.get("digest", "")))
    size = layer.get("size")
    if match is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ModelFileError(f"{manifest}: the model layer's digest / size are not 'sha256:<64 hex>' / bytes")
    blob = models_dir() / "blobs" / f"sha256-{match[1]}"
    try:
        blob_kind = path_kind(blob)
        actual = blob.stat().st_size if blob_kind == "file" else None
    except OSError as exc:
        raise ModelFileError(f"{where}: {blob}: cannot read: {exc.strerror or exc}") from None
    if actual is None:
        raise ModelFileError(f"{where}: the model blob {blob} is missing (an interrupted pull?)")
    if actual != size:
        raise ModelFileError(f"{where}: the model blob {blob} has {actual} bytes, the manifest says {size}")
    return OllamaModel(name, manifest, blob, layer["digest"])
