"""The one exception hierarchy of rsplan.

Every error a user can cause (bad files, bad flags, settings llama.cpp refuses) is an ``RsplanError``;
the CLI turns it into a one-line ``Error: <message>`` and a non-zero exit. Anything else is a bug.
"""


def printable(text: str) -> str:
    """``text`` with control characters escaped, so that an error message naming it stays on one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class RsplanError(ValueError):
    """Base class of every user-facing rsplan error."""


class ModelFileError(RsplanError):
    """A model description (preset YAML, GGUF, config.json) is unreadable, malformed or inconsistent."""


class UnsupportedArchError(RsplanError):
    """The model's architecture is not one rsplan can size exactly."""


class ContextError(RsplanError):
    """Context parameters that llama.cpp would refuse, or that are out of range."""


class DeviceError(RsplanError):
    """A device (GPU) problem: none present, out of memory, missing driver library."""


class BackendError(RsplanError):
    """A backend buffer (``--backend``) whose sizes rsplan cannot predict exactly."""
