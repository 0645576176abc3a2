"""hparams/hf_architectures.py against llama.cpp's converter source: every class registered with
``@ModelBase.register`` whose GGUF carries an arch rsplan sizes is in the table, with exactly its names and arch.

The converter's source is read from llama.cpp's tree (rsplan_testing.LLAMA_CPP: .cache/llama.cpp, unpacked by
scripts/fetch-llama-cpp-source.sh, or $RSPLAN_LLAMA_CPP); the comparison is skipped where it is absent. The table's
own consistency is checked everywhere.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rsplan.hparams.archs import ARCHS
from rsplan.hparams.hf_architectures import BY_MODEL_TYPE, BY_NAME, CONVERTER_CLASSES, hf_classes
from rsplan.hparams.hf_converters import WRITERS
from rsplan_testing import LLAMA_CPP, needs_llama_cpp

#: converter classes whose arch changes at run time (the parse sees only the class attribute)
RUNTIME_ARCHS = {"nemotron.py NemotronHModel": {"nemotron_h_moe"}}


def _registered_classes(root: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    """``"<file>.py <Class>" -> (registered names, llama.cpp arch)`` for every text-model class of the converter
    whose arch (its own ``model_arch`` or the nearest base class's) is in ARCHS."""
    arch_names = dict(re.findall(r'MODEL_ARCH\.(\w+):\s*"([^"]+)"', (root / "gguf-py/gguf/constants.py").read_text()))
    classes: dict[str, tuple[str, list[str], str | None, list[str]]] = {}
    for path in sorted((root / "conversion").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            names = [arg.value for d in node.decorator_list
                     if isinstance(d, ast.Call) and ast.unparse(d.func) == "ModelBase.register"
                     for arg in d.args if isinstance(arg, ast.Constant)]
            arch = None
            for stmt in node.body:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
                if isinstance(target, ast.Name) and target.id == "model_arch" and stmt.value is not None:
                    arch = ast.unparse(stmt.value).rsplit(".", 1)[-1]
            classes[node.name] = (path.name, names, arch, [ast.unparse(b) for b in node.bases])

    def arch_of(name: str) -> str | None:
        _, _, arch, bases = classes[name]
        return arch or next((a for b in bases if b in classes and (a := arch_of(b))), None)

    found = {}
    for name, (file, names, _, _) in classes.items():
        arch = arch_names.get(arch_of(name) or "")
        if names and arch in ARCHS:
            found[f"{file} {name}"] = (tuple(names), arch)
    return found


@needs_llama_cpp("conversion")
def test_table_matches_the_converter_source():
    source = _registered_classes(LLAMA_CPP)
    table = {c.converter: c for c in CONVERTER_CLASSES}
    assert sorted(table) == sorted(source)
    for converter, (names, arch) in source.items():
        assert table[converter].names == names, converter
        assert set(table[converter].archs) == {arch} | RUNTIME_ARCHS.get(converter, set()), converter


def test_names_and_model_types_are_unique():
    names = [n for c in CONVERTER_CLASSES for n in c.names]
    model_types = [t for c in CONVERTER_CLASSES for t in c.model_types]
    assert len(names) == len(set(names)) == len(BY_NAME)
    assert len(model_types) == len(set(model_types)) == len(BY_MODEL_TYPE)


def test_every_class_is_read_or_says_why_not():
    read = {c.converter for c in CONVERTER_CLASSES if c.unread is None}
    assert read == set(WRITERS)
    assert all(c.archs and set(c.archs) <= set(ARCHS) for c in CONVERTER_CLASSES)
    assert all(not c.model_types for c in CONVERTER_CLASSES if c.unread)


def test_hf_classes_of_an_arch():
    assert hf_classes("qwen3next") == ("Qwen3NextForCausalLM",)
    assert hf_classes("mamba") == ("MambaForCausalLM", "MambaLMHeadModel", "FalconMambaForCausalLM")
    assert hf_classes("nemotron_h_moe") == ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM")
    assert hf_classes("llama") == ()
