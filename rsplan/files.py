"""Reading the files a user hands rsplan (model files, profile JSON).

Input files are opened without blocking (a FIFO or a device given as a model must not hang rsplan or make it
read forever), must be regular files, and are read up to a limit; JSON is parsed strictly (no duplicate keys, no
numbers of absurd length, a one-line reason for nesting too deep). Only the standard library is used here:
``rsplan estimate`` imports this module.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, BinaryIO

#: Digits of the longest JSON integer accepted (a uint64 has 20; nothing in a config or a profile needs more).
MAX_JSON_DIGITS = 40


class NotRegularFileError(OSError):
    """The path exists but is a directory, a FIFO, a device or a socket."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(0, "not a regular file", str(path))


class FileTooLargeError(OSError):
    """The file holds more bytes than the reader allows. ``size`` is its size when the file system knows it."""

    def __init__(self, path: str | os.PathLike[str], size: int | None, limit: int) -> None:
        super().__init__(0, f"more than the {limit} bytes allowed", str(path))
        self.size = size
        self.limit = limit


class JSONValueError(ValueError):
    """JSON that parses but that rsplan refuses (duplicate key, absurd number, nesting too deep)."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for binary reading, refusing anything but a regular file.

    The file is opened non-blocking and checked with ``fstat`` on the open descriptor, so a FIFO without a writer
    cannot block the open and a path swapped between a check and the open cannot slip through.

    Raises:
        OSError: the open failed (its ``strerror`` says why), or ``NotRegularFileError``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file ``path``; ``FileTooLargeError`` when it holds more than ``limit``.

    At most ``limit + 1`` bytes are read, whatever the file claims (files under /proc report a size of 0).
    """
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(path, size, limit)
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(path, None, limit)
    return data


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            shown = key if len(key) <= 60 else key[:57] + "..."
            raise JSONValueError(f"duplicate key {json.dumps(shown)}")
        out[key] = value
    return out


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_JSON_DIGITS:
        raise JSONValueError(f"a number of {digits} digits (at most {MAX_JSON_DIGITS} are accepted)")
    return int(text)


def _no_constant(name: str) -> float:
    raise JSONValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, *, allow_nan: bool = True) -> Any:
    """``json.loads``, strictly.

    Raises:
        json.JSONDecodeError: not JSON (its ``msg``, ``lineno`` and ``colno`` say where).
        JSONValueError: a duplicate key in an object, an integer of more than MAX_JSON_DIGITS digits, NaN or
            Infinity when ``allow_nan`` is False, or nesting deeper than the parser can follow.
    """
    try:
        return json.loads(
            text, object_pairs_hook=_object, parse_int=_int, parse_constant=None if allow_nan else _no_constant
        )
    except RecursionError:
        raise JSONValueError("nested too deeply (arrays or objects inside each other)") from None


def path_kind(path: str | os.PathLike[str]) -> str:
    """``"missing"``, ``"dir"``, ``"file"`` (regular) or ``"other"`` (FIFO, device, socket), following symbolic
    links; a dangling link or a link loop is ``"missing"``.

    Raises:
        OSError: any other failure (a name too long, a directory that cannot be searched...).
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "missing"
        raise
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"
