"""``--lazy-mode`` (llama.cpp reads some tensors on demand instead of loading them) touches no arch rsplan sizes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rsplan.hparams.archs import ARCHS, LAZY_READ_ARCHS

LLAMA = Path(os.environ.get("RSPLAN_LLAMA_CPP", "/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp"))


def test_no_arch_rsplan_sizes_has_a_tensor_read_on_demand():
    assert not LAZY_READ_ARCHS & set(ARCHS)


@pytest.mark.skipif(not (LLAMA / "src/models").is_dir(), reason=f"no llama.cpp source at {LLAMA}")
def test_the_lazy_archs_are_every_builder_that_marks_a_tensor_lazy():
    marked = {f.stem for f in (LLAMA / "src/models").glob("*.cpp") if re.search(r"\bTENSOR_READ_LAZY\b", f.read_text())}
    assert marked == LAZY_READ_ARCHS
