"""A file given where a model description (or a --profile) is expected, that is none: the error names the file and
says what is wrong, but never shows the file's content. Only a short name may be shown (a key of a real mapping,
``colour: unknown key``); a line that YAML happens to read as a key (``root:$6$...:::`` of /etc/shadow), a value
with control characters, a non-GGUF file's first bytes, or a 20,000-character GGUF key or architecture are
described, not echoed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import one_line_error

SECRET = "hunter2-s3cr3t"
#: /etc/shadow's shape: a line ending in ':::' is a YAML mapping of that whole line to null
SHADOW = f"root:$6${SECRET}$abc:19000:0:99999:7:::\n"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def written(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.mark.parametrize(("name", "content", "message"), [
    ("shadow", SHADOW,
     "a top-level key that is not a field name (keys are names like block_count; is this a model preset?)"),
    ("nested.yaml", f'name: x\nattention: {{"{SECRET} and more": 1}}\n',
     "attention: a key that is not a field name (keys are names like block_count; is this a model preset?)"),
    ("twice.yaml", SHADOW * 2, "duplicate key at line 2"),
    ("control.yaml", f'name: "{SECRET}\\e[2J"\n', "control character U+001B in the value of name at line 1; presets "
                                                   "are plain text"),
    ("control-key.yaml", f'"{SECRET}\\e[2J": 1\n', "control character U+001B in a key at line 1; presets are plain "
                                                    "text"),
    ("magic.gguf", SHADOW, "header (magic): the file does not start with 'GGUF', not a GGUF file"),
], ids=["shadow line", "nested key", "duplicate line", "control character in a value", "control character in a key",
        "text named .gguf"])
@pytest.mark.parametrize("command", ["estimate", "inspect", "fit"])
def test_a_file_that_is_no_model_is_described_not_echoed(tmp_path, name, content, message, command):
    path = written(tmp_path, name, content)
    assert one_line_error(run(command, "-m", str(path))) == f"{path}: {message}"


@pytest.mark.parametrize(("content", "message"), [
    ("name: x\ncolour: blue\n", "colour: unknown key"),
    ("name: x\ncontex_length: 4\n", "contex_length: unknown key (did you mean context_length?)"),
    ("name: x\nblock-count: 4\n", "block-count: unknown key (did you mean block_count?)"),
    ("block_count: 4\nblock_count: 5\n", "duplicate key 'block_count' at line 2"),
], ids=["unknown key", "misspelt key", "dashed key", "duplicate key"])
def test_a_key_that_is_a_name_is_still_named(tmp_path, content, message):
    path = written(tmp_path, "m.yaml", content)
    assert one_line_error(run("estimate", "-m", str(path))) == f"{path}: {message}"


def test_a_profile_key_that_is_no_name_is_described(tmp_path):
    kernel = {"name": "a", "gbps": 1.0, "copy_gbps": 2.0, SHADOW.strip(): 3}
    path = written(tmp_path, "p.json", json.dumps({"kernels": [kernel]}))
    out = tmp_path / "r.html"
    r = run("report", "-m", "lfm2-1.2b", "--budget", "8GiB", "--profile", str(path), "-o", str(out))
    assert one_line_error(r) == (
        f"--profile {path}: kernels[0]: a key that is not a name: unknown key (accepted: name, gbps, copy_gbps, "
        "inplace_gbps, bytes, time_s, dtype, flag in each kernel; device, model, kernels at the top)"
    )
    assert not out.exists()


def _gstr(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


def _gguf(kvs: list[tuple[str, str | int]]) -> bytes:
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, value in kvs:
        body += _gstr(key) + (struct.pack("<I", 8) + _gstr(value) if isinstance(value, str)
                              else struct.pack("<II", 4, value))
    return body


LONG = "S" * 20000


@pytest.mark.parametrize(("kvs", "message"), [
    ([("general.architecture", LONG)],
     f"general.architecture: architecture '{'S' * 77}...' is not supported (supported: "),
    ([("general.architecture", "mamba2"), (LONG, 1), (LONG, 2)], f"{'S' * 77}...: duplicate key"),
], ids=["20,000-character architecture", "20,000-character key"])
def test_gguf_strings_in_errors_are_cut_short(tmp_path, kvs, message):
    path = written(tmp_path, "m.gguf", _gguf(kvs))
    assert one_line_error(run("estimate", "-m", str(path))).startswith(f"{path}: {message}")
