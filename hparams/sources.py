"""Resolve ``--model``: a built-in preset name, a preset YAML, a GGUF file, or a Hugging Face config.json /
model directory, to a ModelSpec. Heavy readers (gguf, numpy) are imported only for the inputs that need them.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Literal

from rsplan.errors import ModelFileError, either, printable
from rsplan.files import open_regular, path_kind
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.yaml_preset import load_preset_file, load_preset_text

GGUF_MAGIC = b"GGUF"


def presets_dir() -> Path:
    """The folder of the built-in presets (a regular package directory, in a wheel and in a checkout)."""
    import rsplan.presets

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
        shown = printable(name if len(name) <= 80 else name[:77] + "...")
        close = closest_presets(name)
        hint = f"; did you mean {either(close)}?" if close else ""
        raise ModelFileError(f"no built-in preset named '{shown}'{hint} (see `rsplan presets list`)")
    return path


def closest_presets(name: str, n: int = 3) -> list[str]:
    """The built-in presets ``name`` most likely meant: those it begins (``qwen3-next`` ->
    ``qwen3-next-80b-a3b``), then the closest spellings; at most ``n``."""
    if len(name) > 200:
        return []
    names = builtin_preset_names()
    key = name.lower()
    starts = [p for p in names if p.lower().startswith(key)] if len(key) >= 3 else []
    similar = difflib.get_close_matches(key, [p.lower() for p in names], n=n, cutoff=0.6)
    by_lower = {p.lower(): p for p in names}
    return list(dict.fromkeys([*starts, *(by_lower[s] for s in similar)]))[:n]


def load_builtin_preset(name: str) -> ModelSpec:
    path = builtin_preset_path(name)
    return load_preset_text(path.read_text(encoding="utf-8"), f"preset {name}")


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
        raise ModelFileError(f"{ref}: no such file")
    return "preset", builtin_preset_path(ref)


def load_model(ref: str) -> ModelSpec:
    """The ModelSpec for ``--model REF`` (see ``resolve_model`` for how REF is read)."""
    kind, path = resolve_model(ref)
    if kind == "hf":
        from rsplan.hparams.hf_config import load_hf_config

        return load_hf_config(path)
    if kind == "gguf":
        from rsplan.hparams.gguf_file import load_gguf

        return load_gguf(path)
    if kind == "yaml":
        return load_preset_file(path)
    return load_builtin_preset(ref)
