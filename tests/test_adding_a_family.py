"""A new recurrent family touches hparams and kernels only (docs/adding-a-recurrent-family.md): the per-family and
per-op facts live in hparams' tables and the kernel registry, and the profiler derives everything from them.

Checked here without torch: every op a family runs has a kernel package and a registry line; the registry reads
dimensions RecurrentDims has; the profiler names no family and no op (one exception, listed with its reason); the
doc's list of files names files that exist."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import get_args

from rsplan.hparams.archs import ARCHS, Family
from rsplan.hparams.recurrent import BUILDERS, FAMILY_OPS, RWKV_OPS, RecurrentDims
from rsplan.kernels.registry import OPS

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding-a-recurrent-family.md"
#: Profiler modules allowed to name an op, and why.
NAMING_OPS = {
    "profiler/third_party.py": "optional timings against named third-party kernels (mamba-ssm's selective "
                               "state update, fla's gated delta rule); an op without such a library needs nothing "
                               "there",
}
#: Mode switches of StateOp (hparams.recurrent), passed to the kernels as dims: names, not families.
MODES = {mode for ops in FAMILY_OPS.values() for op in ops for mode in op.modes}


def _ops() -> set[str]:
    return {op.op for ops in FAMILY_OPS.values() for op in ops} | set(RWKV_OPS.values())


def test_every_family_has_its_tables():
    families = set(get_args(Family))
    assert families == set(BUILDERS) == set(FAMILY_OPS) == {a.family for a in ARCHS.values()}


def test_every_op_has_a_kernel_package_and_a_registry_line():
    assert _ops() == set(OPS)
    for op in OPS:
        folder = REPO / "kernels" / op
        required = ("__init__.py", "reference.py", "recurrent.py", "profile.py")
        missing = [f for f in required if not (folder / f).is_file()]
        assert not missing, f"kernels/{op}/ lacks {missing}"
        profile = ast.parse((folder / "profile.py").read_text(encoding="utf-8"))
        defined = {node.name for node in profile.body if isinstance(node, ast.FunctionDef)}
        assert {"inputs", "call_bytes"} <= defined, f"kernels/{op}/profile.py must define inputs and call_bytes"


def test_the_registry_reads_fields_of_recurrent_dims():
    fields = {f.name for f in dataclasses.fields(RecurrentDims)}
    for op, entry in OPS.items():
        assert set(entry.dims.values()) <= fields, f"{op}: {set(entry.dims.values()) - fields}"


def test_the_profiler_names_no_family_and_no_op():
    names = set(get_args(Family)) | set(OPS) | MODES
    found = []
    for path in sorted((REPO / "profiler").rglob("*.py")):
        where = str(path.relative_to(REPO))
        if where in NAMING_OPS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{where}:{node.lineno} {node.value!r}")
    assert not found, "per-family or per-op facts in the profiler (move them to hparams or kernels): " + ", ".join(
        found
    )


def test_the_doc_lists_files_that_exist():
    text = DOC.read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("| `")]
    listed = [name for line in table for name in re.findall(r"`([\w/<>.-]+\.py|[\w/<>-]+/)`", line.split("|")[1])]
    assert {"hparams/archs.py", "hparams/recurrent.py", "kernels/registry.py"} <= set(listed)
    for name in listed:
        if "<" in name:  # a pattern: kernels/<op>/
            continue
        assert (REPO / name).exists(), f"{DOC.name} lists {name}, which does not exist"
