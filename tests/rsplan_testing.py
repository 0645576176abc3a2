"""Shared test helpers (importable from every test: pyproject puts tests/ on pythonpath)."""

from __future__ import annotations

import os
from pathlib import Path

from rsplan.hparams.model import ModelSpec

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The project's shared/ folder (beside the checkout), or $RSPLAN_SHARED_DIR."""
    env = os.environ.get("RSPLAN_SHARED_DIR")
    return Path(env) if env else REPO.parent / "shared"


def make_spec(**fields: object) -> ModelSpec:
    """A ModelSpec with name/source filled in."""
    data = {"name": "test", "source": "test", **fields}
    return ModelSpec.model_validate(data)
