"""ModelSpec and its sections are frozen dataclasses with the pydantic methods their callers use: constructing one
validates through hparams/model_schema.py; from_trusted builds one without it; model_copy, model_dump,
model_dump_json and model_fields_set behave as pydantic's do."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import ValidationError

from rsplan.hparams.model import AttentionSpec, ModelSpec, ServingSpec, SSMSpec

MAMBA2 = {
    "name": "m", "source": "test", "arch": "mamba2", "context_length": 4096, "embedding_length": 64,
    "block_count": 2,
    "ssm": {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 8, "group_count": 1},
}


def test_constructing_validates():
    spec = ModelSpec(**MAMBA2)
    assert isinstance(spec.ssm, SSMSpec) and spec.ssm.inner_size == 128
    assert spec.model_fields_set == set(MAMBA2)
    assert spec.ssm.model_fields_set == set(MAMBA2["ssm"])
    assert spec == ModelSpec.model_validate(MAMBA2) == ModelSpec.from_trusted(MAMBA2)
    with pytest.raises(ValidationError, match="block_count"):
        ModelSpec(**{**MAMBA2, "block_count": 0})
    with pytest.raises(ValidationError, match=r"ssm\.group_count is required for arch 'mamba2'"):
        ModelSpec(**{**MAMBA2, "ssm": {k: v for k, v in MAMBA2["ssm"].items() if k != "group_count"}})
    with pytest.raises(ValidationError, match="head_count"):
        AttentionSpec(head_count=-1)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ServingSpec(dtype="bfloat16")
    # a section may be given as its record, as pydantic accepts a model instance
    assert ModelSpec(**{**MAMBA2, "ssm": SSMSpec(**MAMBA2["ssm"])}) == spec


def test_records_are_frozen():
    spec = ModelSpec(**MAMBA2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.block_count = 3  # type: ignore[misc]


def test_model_copy_updates_without_validating():
    spec = ModelSpec(**MAMBA2)
    copy = spec.model_copy(update={"serving": ServingSpec(max_model_len=8192), "block_count": 0})
    assert (copy.block_count, copy.serving.max_model_len, spec.block_count, spec.serving) == (0, 8192, 2, None)
    assert copy.model_fields_set == set(MAMBA2) | {"serving"}
    assert copy.ssm is spec.ssm


def test_model_dump():
    spec = ModelSpec(**MAMBA2)
    dumped = spec.model_dump()
    assert dumped["ssm"] == MAMBA2["ssm"] and dumped["attention"]["head_count"] == 0 and dumped["serving"] is None
    assert spec.model_dump(exclude_unset=True) == MAMBA2
    assert "serving" not in spec.model_dump(exclude_none=True)
    assert "attention" not in spec.model_dump(exclude={"attention"})
    assert json.loads(spec.model_dump_json()) == json.loads(json.dumps(dumped))
    assert list(dumped)[:5] == ["name", "source", "description", "example", "arch"]  # the schema's field order


def test_from_trusted_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="block_count: required key not found"):
        ModelSpec.from_trusted({k: v for k, v in MAMBA2.items() if k != "block_count"})
    with pytest.raises(ValueError, match="nextn_predict_layers \\(3\\) exceeds block_count \\(2\\)"):
        ModelSpec.from_trusted({**MAMBA2, "nextn_predict_layers": 3})


def test_every_interval_arch_has_a_default_interval():
    # hparams/layout marks layer il recurrent by (il + 1) % interval, with the arch's default when a model gives
    # neither attention.recurrent_layers nor full_attention_interval
    from rsplan.hparams.archs import ARCHS

    interval_archs = [info for info in ARCHS.values() if info.layer_rule == "interval"]
    assert {info.name for info in interval_archs} >= {"qwen3next", "qwen35", "minimax-01"}
    assert all(info.full_attention_interval for info in interval_archs)


def test_every_record_has_the_schema_of_its_name():
    # model_schema knows the records by class name only (it does not import model.py): each record class has a
    # schema under its name, with the same fields in the same order
    from rsplan.hparams import model
    from rsplan.hparams.model_schema import SCHEMAS

    records = {name: cls for name, cls in vars(model).items()
               if isinstance(cls, type) and issubclass(cls, model.Record) and cls is not model.Record}
    assert set(records) == set(SCHEMAS)
    for name, cls in records.items():
        assert [f.name for f in dataclasses.fields(cls)] == list(SCHEMAS[name].model_fields), name
