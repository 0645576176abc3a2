"""Resolve ``--model``: a built-in preset name, a preset YAML, a GGUF file, or a Hugging Face config.json /
model directory, to a ModelSpec. Heavy readers (gguf, numpy) are imported only for the inputs that need them.
"""

from __future__ import annotations

from pathlib import Path

from rsplan.errors import ModelFileError
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


def builtin_preset_path(name: str) -> Path:
    """The YAML file of built-in preset ``name``; a ModelFileError if there is none."""
    path = presets_dir() / f"{name}.yaml"
    if "/" in name or "\\" in name or not path.is_file():
        raise ModelFileError(f"no built-in preset named '{name}' (see `rsplan presets list`)")
    return path


def load_builtin_preset(name: str) -> ModelSpec:
    path = builtin_preset_path(name)
    return load_preset_text(path.read_text(encoding="utf-8"), f"preset {name}")


def _looks_like_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def load_model(ref: str) -> ModelSpec:
    """The ModelSpec for ``--model REF``.

    A path that exists is read as a file (GGUF by magic or suffix, config.json or a directory holding one,
    otherwise preset YAML); anything else must be a built-in preset name.
    """
    path = Path(ref)
    if path.is_dir():
        from rsplan.hparams.hf_config import load_hf_config

        return load_hf_config(path)
    if path.is_file():
        if _looks_like_gguf(path):
            from rsplan.hparams.gguf_file import load_gguf

            return load_gguf(path)
        if path.suffix.lower() == ".json":
            from rsplan.hparams.hf_config import load_hf_config

            return load_hf_config(path)
        return load_preset_file(path)
    if path.exists():
        raise ModelFileError(f"{ref}: not a regular file or directory")
    if "/" in ref or "\\" in ref or ref.lower().endswith((".yaml", ".yml", ".gguf", ".json")):
        raise ModelFileError(f"{ref}: no such file")
    return load_builtin_preset(ref)
