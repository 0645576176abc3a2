"""Preset YAML files -> ModelSpec, defensively.

A preset is a small YAML mapping (docs/preset-schema.md). Before it is parsed into Python objects the event
stream is checked: aliases are refused (no alias bombs), nesting is bounded, and the file must be UTF-8 text of
at most ``MAX_PRESET_BYTES``.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rsplan.errors import ModelFileError, UnsupportedArchError, either, key_name
from rsplan.files import FileTooLargeError, NotRegularFileError, read_limited
from rsplan.hparams.archs import arch_info
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.model_limits import MAX_LAYERS

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_PRESET_BYTES = 1 << 20
MAX_DEPTH = 8
#: The longest list: per-layer lists have block_count entries, at most llama.cpp's 512 layers.
MAX_LIST = 4 * MAX_LAYERS
#: The longest integer literal (a u64 has 20 digits; hex, binary and _ separators take a few more characters).
MAX_INT_CHARS = 80

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_YAML_TAG = "tag:yaml.org,2002:"
_STR_TAG = _YAML_TAG + "str"
_RESOLVER = yaml.resolver.Resolver()
#: Control characters (C0 but tab and newlines, DEL, C1) and the invisible bidirectional controls that reorder
#: the text around them on a terminal.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(value: str) -> str:
    value = value if len(value) <= 60 else value[:57] + "..."
    return value.encode("unicode_escape").decode("ascii") if not value.isprintable() else value


def _line(event: yaml.Event) -> int:
    """The 1-based line where ``event`` starts (yaml.parse gives every event its marks)."""
    mark = event.start_mark
    assert mark is not None, "yaml.parse events carry their marks"
    return mark.line + 1


def _check_scalar(event: yaml.ScalarEvent, where: str, is_key: bool, key: str | None) -> None:
    """A value must be plain text (no control characters: they would act on the terminal that prints the
    preset's name or source); a key must be a name, not something YAML reads as a number, bool or null.

    ``key``: the key whose value ``event`` is (None: a key, or a list entry). The text itself is never shown
    (the file may be no preset at all); the key is, where it is a name (rsplan.errors.key_name)."""
    line = _line(event)
    control = _CONTROL.search(event.value)
    if control:
        named = key_name(key)
        what = "a key" if is_key else f"the value of {named}" if named else "a value"
        raise ModelFileError(
            f"{where}: control character U+{ord(control.group()):04X} in {what} at line {line}; "
            "presets are plain text"
        )
    tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
    kind = tag.rsplit(":", 1)[-1]
    if is_key and tag != _STR_TAG:
        raise ModelFileError(
            f"{where}: key '{_shown(event.value)}' at line {line} is not a name: YAML reads it as {kind} "
            "(keys are names like block_count)"
        )
    if kind == "int" and len(event.value) > MAX_INT_CHARS:
        raise ModelFileError(f"{where}: a number of {len(event.value)} characters at line {line}; no preset value is "
                             "that long")
    if kind == "timestamp":  # YAML would build a date (and fail on 2001-13-45): no preset value is one
        raise ModelFileError(f"{where}: '{_shown(event.value)}' at line {line} is a date, not a preset value")


def _count_item(top: list | None, event: yaml.Event, where: str) -> None:
    """Count one more item of the open list ``top``: a list longer than any per-layer list is refused as soon
    as it is, before the whole of it is parsed, built and validated."""
    if top is None or top[0]:
        return
    top[3] += 1
    if top[3] > MAX_LIST:
        raise ModelFileError(
            f"{where}: a list of more than {MAX_LIST} entries at line {_line(event)} "
            f"(per-layer lists have block_count entries, at most {MAX_LAYERS})"
        )


def _check_events(text: str, where: str) -> None:
    """Refuse aliases, tags, deep nesting, complex keys, keys that are not names, duplicate keys, control
    characters, dates and absurdly long numbers before anything is built (YAML's constructors would raise
    plain ValueErrors on some of them)."""
    # one frame per open collection: [is_mapping, keys seen, expecting a key, items so far, the last key]
    stack: list[list] = []
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            raise ModelFileError(f"{where}: YAML aliases are not allowed in presets")
        top = stack[-1] if stack else None
        tag = getattr(event, "tag", None)
        if tag not in (None, "!"):
            shown = "!!" + tag.removeprefix(_YAML_TAG) if tag.startswith(_YAML_TAG) else tag
            raise ModelFileError(
                f"{where}: YAML tags ({_shown(shown)} at line {_line(event)}) are not allowed in presets"
            )
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if top is not None and top[0] and top[2]:
                raise ModelFileError(f"{where}: only plain keys are allowed (line {_line(event)})")
            if len(stack) >= MAX_DEPTH:
                raise ModelFileError(f"{where}: YAML nested deeper than {MAX_DEPTH} levels")
            _count_item(top, event, where)
            stack.append([isinstance(event, yaml.MappingStartEvent), set(), True, 0, None])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()
            if stack and stack[-1][0]:
                stack[-1][2] = True  # the collection was a value: a key comes next
        elif isinstance(event, yaml.ScalarEvent):
            _count_item(top, event, where)
            is_key = top is not None and top[0] and top[2]
            _check_scalar(event, where, is_key, top[4] if top is not None and top[0] and not is_key else None)
            if top is not None and top[0]:
                if is_key:
                    if event.value in top[1]:
                        named = key_name(event.value)
                        raise ModelFileError(
                            f"{where}: duplicate key {f'{named!r} ' if named else ''}at line {_line(event)}"
                        )
                    top[1].add(event.value)
                    top[4] = event.value
                top[2] = not top[2]


def _parse_yaml(text: str, where: str) -> object:
    try:
        _check_events(text, where)
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        lines = text.splitlines()
        if mark is not None and mark.line < len(lines) and "\t" in lines[mark.line]:
            problem = "a tab character; YAML indents with spaces only"
        raise ModelFileError(f"{where}: invalid YAML{at}: {problem}") from None


def _is_union_tag(part: object) -> bool:
    # pydantic names the branches of a union ("constrained-int", "list[constrained-int]") in the location
    return isinstance(part, str) and ("[" in part or "-" in part)


#: pydantic error types of a value of the wrong kind or out of range: the message echoes the value given.
_ECHOED = ("_type", "_parsing", "greater_than", "less_than", "literal_error", "string_pattern_mismatch",
           "too_long", "too_short", "finite_number")


def _keys_at(loc: tuple[object, ...]) -> list[str]:
    """The keys a mapping at ``loc`` (a key path under ModelSpec) may hold: its schema's field names."""
    from pydantic import BaseModel  # deferred: pydantic

    from rsplan.hparams.model_schema import ModelSchema  # deferred: pydantic

    model: type[BaseModel] = ModelSchema
    for part in loc:
        if isinstance(part, int) or _is_union_tag(part):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return []
        model = inner[0]
    return list(model.model_fields)


def _echo(value: object) -> str:
    """A value as the preset wrote it, for ``..., got <value>`` (with the fix, where the value is a number that
    YAML read as text)."""
    if isinstance(value, str):
        hint = ""
        if re.fullmatch(r"[-+]?[0-9]+", value):
            hint = f" (quoted: write {value} without quotes)"
        elif re.fullmatch(r"[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+", value) and float(value).is_integer() \
                and abs(float(value)) < 1e19:
            hint = f" (YAML reads {value} as text: write {int(float(value))})"
        return f"the text '{_shown(value)}'{hint}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    return _shown(repr(value))


def _loc_text(parts: tuple[object, ...]) -> str:
    """A pydantic location as a key path: ``attention.head_count``, ``ssm[2]`` (union branch tags left out)."""
    loc = ""
    for part in parts:
        if _is_union_tag(part):
            continue
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    return loc


def validation_message(exc: ValidationError) -> str:
    """The most telling pydantic error as ``field.path[i]: message`` on one line.

    An unknown key comes first (with the closest known keys: a misspelt key otherwise surfaces as the real key
    "Field required"). For a scalar-or-list field, pydantic reports one error per union branch; an error inside a
    list element (a location with an index) names the offending entry, so it is preferred over the scalar
    branch's. A value of the wrong type or out of range is echoed.
    """
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), None) \
        or next((e for e in errors if any(isinstance(p, int) for p in e["loc"])), errors[0])
    if err["type"] == "extra_forbidden" and key_name(err["loc"][-1]) is None:
        # a line of some text file rather than a misspelt field: described, never shown
        parent = _loc_text(err["loc"][:-1])
        where = f"{parent}: a key" if parent else "a top-level key"
        return f"{where} that is not a field name (keys are names like block_count; is this a model preset?)"
    loc = _loc_text(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        parent = _loc_text(err["loc"][:-1])  # the key itself is no union tag, even with a '-' in it
        loc = f"{parent}.{key}" if parent else key
        import difflib  # deferred: difflib, for a misspelt key only (start-up time: rsplan estimate)

        close = difflib.get_close_matches(key, _keys_at(err["loc"][:-1]), n=3, cutoff=0.6)
        msg = "unknown key" + (f" (did you mean {either(close)}?)" if close else "")
    elif any(t in err["type"] for t in _ECHOED) and "input" in err:
        msg += f", got {_echo(err['input'])}"
    return f"{loc}: {msg}" if loc else msg


def spec_from_mapping(data: object, where: str) -> ModelSpec:
    """Validate a parsed mapping as a ModelSpec; errors name ``where`` and the field."""
    if not isinstance(data, dict):
        got = "an empty document" if data is None else type(data).__name__
        raise ModelFileError(f"{where}: expected a mapping of keys to values, got {got}")
    arch = data.get("arch")
    if isinstance(arch, str):
        try:
            arch_info(arch)  # an unknown arch is its own clear error, not a field error
        except UnsupportedArchError as exc:
            raise UnsupportedArchError(f"{where}: arch: {exc}") from None
    from pydantic import ValidationError  # deferred: pydantic

    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise ModelFileError(f"{where}: {validation_message(exc)}") from None


def read_text_file(path: Path, limit: int) -> str:
    """Read a small UTF-8 text file, refusing binary content, oversized files and anything but a regular file
    (a FIFO or a device is neither waited on nor read forever)."""
    try:
        raw = read_limited(path, limit)
    except FileTooLargeError as exc:
        if exc.size is None:  # a /proc-like file that reports no size
            raise ModelFileError(f"{path}: file holds more than the {limit} bytes allowed") from None
        raise ModelFileError(f"{path}: file is {exc.size} bytes, more than the {limit} allowed") from None
    except NotRegularFileError:
        raise ModelFileError(f"{path}: not a regular file") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read file: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        raise ModelFileError(f"{path}: binary file, not YAML/JSON text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def load_preset_text(text: str, where: str) -> ModelSpec:
    return spec_from_mapping(_parse_yaml(text, where), where)


def load_trusted_preset_text(text: str, where: str) -> ModelSpec:
    """A preset shipped with rsplan: parsed as any preset, built without the validation schema
    (``ModelSpec.from_trusted``: the test suite validates every shipped preset against it), checked for
    consistency."""
    data = _parse_yaml(text, where)
    if not isinstance(data, dict):
        raise ModelFileError(f"{where}: expected a mapping of keys to values, got {type(data).__name__}")
    try:
        return ModelSpec.from_trusted(data)
    except ValueError as exc:
        raise ModelFileError(f"{where}: {exc}") from None


def load_preset_file(path: Path) -> ModelSpec:
    return load_preset_text(read_text_file(path, MAX_PRESET_BYTES), str(path))
