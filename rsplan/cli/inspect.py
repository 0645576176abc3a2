"""``rsplan inspect``: the hyper-parameters rsplan read from a model, where each came from, and its layer map."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from rsplan.cli.errors import user_errors
from rsplan.cli.options import model_options
from rsplan.cli.sections import SectionedCommand, section

if TYPE_CHECKING:
    from rsplan.hparams.layout import CacheLayout
    from rsplan.hparams.model import ModelSpec
    from rsplan.hparams.sources import ReadModel

#: ModelSpec fields that are labels, not hyper-parameters.
_LABELS = ("name", "source", "description")
#: A per-layer list longer than this is abbreviated in the table (the layer map shows every entry).
_LIST_SHOWN = 12


def _read(ref: str) -> ReadModel:
    """The model and where each of its facts came from (``sources.read_model``)."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import read_model

    return read_model(ref)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _flat_fields(spec: ModelSpec, *, set_only: bool = False) -> dict[str, Any]:
    return _flat(spec.model_dump(mode="json", exclude_none=True, exclude_unset=set_only))


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 4, 6, 7]`` -> ``0-2, 4, 6-7``."""
    if not values:
        return "none"
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


def _show(value: Any) -> str:
    if isinstance(value, list):
        shown = ", ".join(str(int(v)) if isinstance(v, bool) else str(v) for v in value[:_LIST_SHOWN])
        more = f", ... ({len(value)} entries)" if len(value) > _LIST_SHOWN else ""
        return f"[{shown}{more}]"
    return str(value)


def _layers(spec: ModelSpec, layout: CacheLayout) -> list[dict[str, Any]]:
    recurrent = set(layout.recurrent_layers)
    kv = layout.kv_by_layer
    rows = []
    for il in range(spec.block_count):
        layer = kv.get(il)
        rows.append({
            "layer": il,
            "mtp": il >= spec.n_layer,
            "kv": layer is not None,
            "n_embd_k_gqa": layer.n_embd_k_gqa if layer else 0,
            "n_embd_v_gqa": (layer.n_embd_v_gqa if layout.has_v else 0) if layer else 0,
            "swa": bool(layer and layer.is_swa),
            "recurrent": il in recurrent,
        })
    return rows


def _as_json(ins: ReadModel, layout: CacheLayout, layers: list[dict[str, Any]]) -> dict[str, Any]:
    spec = ins.spec
    return {
        "input": {"kind": ins.kind, "source": spec.source, **ins.facts},
        "model": spec.model_dump(mode="json", exclude_none=True),
        "sources": ins.sources,
        "arch": {"family": layout.family, "memory": spec.info.memory, "rollback": spec.info.rollback},
        "n_layer": spec.n_layer,
        "n_embd_r": layout.n_embd_r,
        "n_embd_s": layout.n_embd_s,
        "kv_layers": [row["layer"] for row in layers if row["kv"]],
        "recurrent_layers": list(layout.recurrent_layers),
        "swa_layers": [row["layer"] for row in layers if row["swa"]],
        "n_swa": layout.n_swa,
        "layers": layers,
    }


def _fetched(entry: dict[str, Any]) -> str:
    n = entry.get("requests", 0)
    return f"{entry.get('bytes_fetched', 0):,} bytes fetched in {n} request{'' if n == 1 else 's'}"


def _origin_lines(origin: dict[str, Any]) -> list[str]:
    """Where the model's bytes came from: the file, the URL, the repo and revision, and what was fetched."""
    form = origin.get("form")
    if form == "url":
        return [f"read by range from {f['url']}: {_fetched(f)}" for f in origin["files"]]
    if form == "ollama":
        return [f"Ollama model {origin['name']}: manifest {origin['manifest']} -> blob {origin['blob']}"]
    if form == "hub":
        out = [f"Hugging Face repo {origin['repo']} at revision {origin['revision']} (files listed from "
               f"{origin['listing']}); {origin['bytes_fetched']:,} bytes fetched in total"]
        for f in origin["files"]:
            where = f"{f['from']} {f['file']}" if "file" in f else f"{f['url']}: {_fetched(f)}"
            out.append(f"  {f['path']}: {where}")
        return out + [f"  note: {note}" for note in origin["notes"]]
    return []


def _as_table(ins: ReadModel, layout: CacheLayout, layers: list[dict[str, Any]]) -> str:
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.render.tables import prose, table
    from rsplan.render.units import human

    spec = ins.spec
    info = spec.info
    kind = {"gguf": "GGUF file", "hf": "Hugging Face config.json", "preset": "preset"}[ins.kind]
    out = [f"{spec.name}: {spec.arch} ({info.memory}, {layout.family} family), from {kind} {spec.source}"]
    if ins.kind == "hf":
        by = (f"architectures {ins.facts['architecture']}" if ins.facts["architecture"]
              else f"model_type {ins.facts['model_type']}")
        out.append(f"{by}, mapped as llama.cpp's converter {ins.facts['converter']}")
    if ins.kind == "gguf":
        by_type = ", ".join(f"{t} {human(n)}" for t, n in ins.facts["tensor_bytes"].items()) or "no tensors"
        parts = f" in {len(ins.facts['files'])} parts" if len(ins.facts["files"]) > 1 else ""
        out.append(f"GGUF v{ins.facts['gguf_version']}, {ins.facts['n_tensors']} tensors{parts}: {by_type}")
    if "weights_by_dtype" in ins.facts:
        out.append("safetensors weights: " + ", ".join(
            f"{t} {n:,} B ({human(n)})" for t, n in ins.facts["weights_by_dtype"].items()))
    out += _origin_lines(ins.facts.get("origin", {}))
    rows = []
    fields = _flat_fields(spec)
    for key, value in fields.items():
        if key in _LABELS:
            continue
        shown = f"{value:,}" if key == "weights_bytes" else _show(value)
        rows.append([key, shown, ins.sources.get(key, "default")])
    # values llama.cpp derives when a key is absent (head dims, KV heads)
    rows += [[key, "-", how] for key, how in ins.sources.items() if key not in fields]
    out += ["", table(rows, ["hyper-parameter", "value", "read from"], wrap=(2, 1))]
    kv = [row["layer"] for row in layers if row["kv"]]
    swa = [row["layer"] for row in layers if row["swa"]]
    out += [
        "",
        f"n_layer {spec.n_layer} (block_count {spec.block_count}, MTP {spec.nextn_predict_layers}); "
        f"n_embd_r {layout.n_embd_r:,} (conv state), n_embd_s {layout.n_embd_s:,} (recurrent state) elements",
        f"KV layers ({len(kv)}): {_ranges(kv)}",
        f"R/S layers ({len(layout.recurrent_layers)}): {_ranges(list(layout.recurrent_layers))}",
        f"SWA layers ({len(swa)}): {_ranges(swa)}" + (f", window {layout.n_swa}" if layout.n_swa else ""),
        "",
    ]
    layer_rows = [
        [
            row["layer"] if not row["mtp"] else f"{row['layer']} (MTP)",
            f"{row['n_embd_k_gqa']} / {row['n_embd_v_gqa']}" if row["kv"] else "-",
            "yes" if row["swa"] else "-",
            "yes" if row["recurrent"] else "-",
        ]
        for row in layers
    ]
    out.append(table(layer_rows, ["layer", "KV row (K / V)", "SWA", "R/S"], align=("right", "right", "left", "left")))
    return "\n".join(prose(line) for line in out)


@click.command(cls=SectionedCommand)
@model_options()
@section("Output", [click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                                 show_default=True,
                                 help="table, or json (every field, where it came from, and the layer map).")])
@user_errors
def inspect(model_ref: str, fmt: str) -> None:
    """Show the hyper-parameters rsplan read from a model, where each came from, and its per-layer cache map.

    For a GGUF file each value names its metadata key; for a config.json, the config keys and the GGUF key
    llama.cpp's converter would write. Also shown: the recurrent row widths n_embd_r / n_embd_s and which
    layers carry a KV cache, a recurrent state (R/S) or a sliding window.

    \b
    Examples:
      rsplan inspect --model model.gguf
      rsplan inspect --model ./Qwen3-Next-80B-A3B-Instruct --format json
    """
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.layout import cache_layout

    ins = _read(model_ref)
    layout = cache_layout(ins.spec)
    layers = _layers(ins.spec, layout)
    if fmt == "json":
        click.echo(json.dumps(_as_json(ins, layout, layers), indent=2))
    else:
        click.echo(_as_table(ins, layout, layers))
