"""The one exception hierarchy of rsplan.

Every error a user can cause (bad files, bad flags, settings llama.cpp refuses) is an ``RsplanError``;
the CLI turns it into a one-line ``Error: <message>`` and a non-zero exit. Anything else is a bug.
"""

import importlib
import re

#: A key an error message may show: a short name, as the fields of a model description are (``block_count``,
#: ``rope_scaling``, ``mamba2.block_count``). A key of any other shape is likely a line of a file that is not a
#: model description (``root:$6$...:::`` of /etc/shadow reads as a YAML key): it is described, never shown.
_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,79}", re.ASCII)


def key_name(key: object) -> str | None:
    """``key`` if an error may show it (a short ASCII name), else None."""
    return key if isinstance(key, str) and _KEY_NAME.fullmatch(key) else None


def printable(text: str) -> str:
    """``text`` with control characters escaped, so that an error message naming it stays on one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def excerpt(text: str, limit: int = 80) -> str:
    """``text`` as an error message names it: control characters escaped (``printable``), cut to ``limit``
    characters with ``...`` (a name read from a file may be thousands of characters long)."""
    return printable(text if len(text) <= limit else text[: limit - 3] + "...")


def either(names: list[str]) -> str:
    """``["a", "b", "c"]`` -> ``a, b or c`` (for "did you mean ...?")."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class RsplanError(ValueError):
    """Base class of every user-facing rsplan error."""


class ModelFileError(RsplanError):
    """A model description (preset YAML, GGUF, config.json) is unreadable, malformed or inconsistent."""


class RecurrentDimsError(ModelFileError):
    """A model whose recurrent state does not split into whole heads and groups (hparams.recurrent): llama.cpp
    sizes its rows, but the kernels and the serving engines work per head."""


class UnsupportedArchError(RsplanError):
    """The model's architecture is not one rsplan can size exactly."""


class ContextError(RsplanError):
    """Context parameters that llama.cpp would refuse, or that are out of range."""


class DeviceError(RsplanError):
    """A device (GPU) problem: none present, out of memory, missing driver library."""


class BackendError(RsplanError):
    """A backend buffer (``--backend``) whose sizes rsplan cannot predict exactly."""


class DependencyError(RsplanError):
    """An optional library the command needs (plotly, gguf, torch) is not installed: the message gives the pip
    command that installs it."""


def require(module: str, needed_for: str, extra: str) -> None:
    """Import ``module`` or raise a DependencyError naming ``pip install 'rsplan[<extra>]'``.

    ``needed_for`` completes "... needs the <module> package": ``rsplan report``, ``reading a GGUF file``.
    """

    try:
        importlib.import_module(module)
    except ImportError:
        raise DependencyError(f"{needed_for} needs the {module} package, which is not installed: "
                              f"pip install 'rsplan[{extra}]'") from None
