"""Reading the files a user hands rsplan (model files, profile JSON) and writing the ones it produces.

Input files are opened without blocking (a FIFO or a device given as a model must not hang rsplan or make it
read forever), must be regular files, and are read up to a limit; JSON is parsed strictly (no duplicate keys, no
numbers of absurd length, a one-line reason for nesting too deep). Output files are written whole or not at all
(``AtomicFile``), never over a read-only file, a device or a FIFO. Only the standard library is used here:
``rsplan estimate`` imports this module.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

#: Digits of the longest JSON integer accepted (a uint64 has 20; nothing in a config or a profile needs more).
MAX_JSON_DIGITS = 40


class NotRegularFileError(OSError):
    """The path exists but is a FIFO, a device or a socket (a directory is ``IsADirectoryError``)."""

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
        OSError: the open failed (its ``strerror`` says why), ``IsADirectoryError`` (as open() says for a
            directory), or ``NotRegularFileError`` (FIFO, device, socket).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
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
            # deferred: json, which reading a built-in preset (rsplan estimate's start-up) does not need
            import json

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
    import json  # deferred: json, which reading a built-in preset (rsplan estimate's start-up) does not need

    try:
        return json.loads(
            text, object_pairs_hook=_object, parse_int=_int, parse_constant=None if allow_nan else _no_constant
        )
    except RecursionError:
        raise JSONValueError("nested too deeply (arrays or objects inside each other)") from None


class AtomicFile:
    """A file written all at once, or not at all.

    ``AtomicFile(path, what, error)`` checks, before any work is done, that ``path`` can be written: a regular
    file or a new name, in a directory where a file can be created. An existing read-only file, a directory, a
    FIFO or a device is refused (a device or FIFO would otherwise be replaced by a regular file). ``commit``
    writes the text to a temporary file beside the target and renames it over the target, so readers see the
    old file or the whole new one and a failure leaves nothing behind. A symbolic link is followed: its target is
    replaced and the link kept. Errors are ``error("cannot write <what> to <path>: <why>")``.
    """

    def __init__(self, path: str | os.PathLike[str], what: str, error: type[Exception]) -> None:
        self.shown, self.what, self.error = str(path), what, error
        if not self.shown:
            raise self._fail("empty file name")
        if self.shown.endswith(os.sep):  # realpath would drop the slash and write a file of that name
            raise self._fail("a file name cannot end with /, which names a directory")
        self.path = Path(os.path.realpath(path))
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise self._fail(exc.strerror or str(exc)) from None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise self._fail("it is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise self._fail("not a regular file (a FIFO or a device is never replaced)")
            # os.access alone says yes to root; the mode bits say what the owner meant
            if not st.st_mode & 0o222 or not os.access(self.path, os.W_OK):
                raise self._fail("the file is read-only (left untouched)")
        self._temp(b"").unlink()  # the directory must let us create the temporary file

    def _fail(self, why: str) -> Exception:
        return self.error(f"cannot write {self.what} to {self.shown}: {why}")

    def _temp(self, payload: bytes) -> Path:
        """A new temporary file beside the target holding ``payload`` (removed again if writing fails)."""
        tmp = self.path.parent / f".{self.path.name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise self._fail(exc.strerror or str(exc)) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._fail(exc.strerror or str(exc)) from None
            raise
        return tmp

    def commit(self, text: str) -> int:
        """Write ``text`` (UTF-8) and move it into place; returns the bytes written."""
        payload = text.encode("utf-8")
        tmp = self._temp(payload)
        try:
            if self.path.exists():
                os.chmod(tmp, stat.S_IMODE(os.stat(self.path).st_mode))
            os.replace(tmp, self.path)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._fail(exc.strerror or str(exc)) from None
            raise
        return len(payload)


def path_kind(path: str | os.PathLike[str]) -> str:
    """``"missing"``, ``"dir"``, ``"file"`` (regular) or ``"other"`` (FIFO, device, socket), following symbolic
    links; a dangling link is ``"missing"``.

    Raises:
        OSError: any other failure (a link loop, a name too long, a directory that cannot be searched...).
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"
