"""``--lazy-mode`` (llama.cpp reads some tensors on demand instead of loading them) touches no arch rsplan sizes."""

from __future__ import annotations

import re

from rsplan.hparams.archs import ARCHS, LAZY_READ_ARCHS
from rsplan_testing import LLAMA_CPP, needs_llama_cpp


def test_no_arch_rsplan_sizes_has_a_tensor_read_on_demand():
    assert not LAZY_READ_ARCHS & set(ARCHS)


@needs_llama_cpp("src/models")
def test_the_lazy_archs_are_every_builder_that_marks_a_tensor_lazy():
    builders = (LLAMA_CPP / "src/models").glob("*.cpp")
    marked = {f.stem for f in builders if re.search(r"\bTENSOR_READ_LAZY\b", f.read_text())}
    assert marked == LAZY_READ_ARCHS
