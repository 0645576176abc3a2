"""Bounded HTTP range reads: the first bytes of a remote file (a GGUF or safetensors header), never its data.

Every request asks for an explicit byte range and reads at most that many bytes of the answer, even from a server
that ignores ``Range`` and starts sending the whole file. Failures become one-line ModelFileErrors: 404, 401/403
(with the hint to set HF_TOKEN for a Hugging Face URL), 429/5xx after ``RETRIES`` tries (waiting as the server's
Retry-After says, at most ``MAX_WAIT_S`` each), a stall (no byte for ``timeout_s()`` seconds: HF_HUB_DOWNLOAD_TIMEOUT,
default 10 s), a redirect loop, a short (truncated) answer.

The HTTP client is huggingface_hub's (httpx; httpx2 from huggingface_hub 2): it follows redirects (at most 20)
and drops the Authorization header when a redirect leaves the host (a CDN), so an HF token goes to the hub only.
It is imported on the first remote read.
"""

from __future__ import annotations

import importlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rsplan.errors import ModelFileError, printable

#: Tries of a request the server answered 429 or 5xx (the first included).
RETRIES = 3
#: The longest wait between two tries, seconds (a Retry-After beyond it is cut to it).
MAX_WAIT_S = 2.0
#: Bytes read per chunk of a streamed answer.
_CHUNK = 1 << 16
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def http_module() -> Any:
    """The HTTP library huggingface_hub's session is built on (httpx in huggingface_hub 1.x, httpx2 in 2.x: the
    same exception classes), for catching its errors."""
    from huggingface_hub.utils import get_session  # deferred: huggingface_hub

    return importlib.import_module(type(get_session()).__module__.split(".", 1)[0])


def timeout_s() -> float:
    """Seconds to wait for a byte: HF_HUB_DOWNLOAD_TIMEOUT (read when called, as huggingface_hub reads it at
    import), default 10."""
    raw = os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", "")
    try:
        value = float(raw) if raw.strip() else 10.0
    except ValueError:
        raise ModelFileError(f"HF_HUB_DOWNLOAD_TIMEOUT: '{printable(raw[:40])}' is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise ModelFileError(f"HF_HUB_DOWNLOAD_TIMEOUT: {value} is not in (0, 3600] seconds")
    return value


@dataclass
class FetchLog:
    """What the remote reads of one model cost: requests made and body bytes received (all files together)."""

    requests: int = 0
    bytes_read: int = 0
    urls: list[str] = field(default_factory=list)


def shown_url(url: str) -> str:
    """``url`` without its query string (a signed CDN URL carries credentials there), printable, on one line."""
    parts = urlsplit(url)
    return printable(f"{parts.scheme}://{parts.netloc}{parts.path}")


@dataclass
class RangeReader:
    """Reads byte ranges of one remote file.

    Attributes:
        url: the file's URL.
        headers: extra request headers (the hub's Authorization and user agent, for a hub URL).
        log: where requests and bytes are counted.
        size: the file's size in bytes, known after the first read (from Content-Range).
        hint: a sentence added to a 401/403 error (how to authenticate).
    """

    url: str
    headers: dict[str, str]
    log: FetchLog
    size: int | None = None
    hint: str = ""

    def _fail(self, problem: str) -> ModelFileError:
        return ModelFileError(f"{shown_url(self.url)}: {problem}")

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the file (fewer only where the file ends first).

        Raises:
            ModelFileError: any HTTP failure (see the module), a range the server answers with other bytes, or an
                answer shorter than it declared.
        """
        if end <= start:
            return b""
        for attempt in range(1, RETRIES + 1):
            status, wait = self._try_read(start, end)
            if isinstance(status, bytes):
                return status
            if attempt == RETRIES:
                raise self._fail(f"HTTP {status} from the server, {RETRIES} tries; try again later")
            time.sleep(wait if wait is not None else 0.25 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _try_read(self, start: int, end: int) -> tuple[bytes | int, float | None]:
        """One request: the bytes, or (a retryable status, the wait the server asked for)."""
        from huggingface_hub.utils import get_session  # deferred: huggingface_hub

        http = http_module()

        headers = {**self.headers, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        timeout = timeout_s()
        self.log.requests += 1
        try:
            with get_session().stream("GET", self.url, headers=headers, timeout=timeout) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    return status, _retry_after(response.headers.get("Retry-After"))
                self._check_status(status, response.headers, start)
                encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise self._fail(f"the server sent the bytes {printable(encoding[:20])}-encoded, not as they are")
                expected, total = self._expected(status, response.headers, start, end)
                data = self._body(response, expected)
        except ModelFileError:
            raise
        except http.RemoteProtocolError:
            raise self._fail("the server closed the connection mid-answer: truncated") from None
        except http.TooManyRedirects:
            raise self._fail("too many redirects (a redirect loop?)") from None
        except http.TimeoutException:
            raise self._fail(f"the server sent nothing for {timeout:g} s (HF_HUB_DOWNLOAD_TIMEOUT); "
                             "timed out") from None
        except http.HTTPError as exc:
            raise self._fail(f"cannot fetch: {printable(str(exc) or type(exc).__name__)}") from None
        except OSError as exc:
            raise self._fail(f"cannot fetch: {printable(str(exc))}") from None
        self.size = total if total is not None else self.size
        if str(response.url) not in self.log.urls:
            self.log.urls.append(str(response.url))
        return data, None

    def _check_status(self, status: int, headers: Any, start: int) -> None:
        if status in (401, 403):
            gated = headers.get("X-Error-Code") == "GatedRepo"
            what = "a gated model: accept its terms on the hub, then" if gated else "access denied (private or gated?):"
            raise self._fail(f"HTTP {status}, {what} {self.hint or 'give credentials'}".rstrip())
        if status == 404:
            raise self._fail("HTTP 404, no such file")
        if status == 416:
            raise self._fail(f"the file ends before byte {start} (HTTP 416): truncated")
        if status == 200 and start > 0:
            raise self._fail("the server ignores range requests (HTTP 200 for a range past the start)")
        if status not in (200, 206):
            raise self._fail(f"HTTP {status}")

    def _expected(self, status: int, headers: Any, start: int, end: int) -> tuple[int, int | None]:
        """(bytes the answer must hold, the file's size if said)."""
        if status == 206:
            match = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
            if match is None or int(match[1]) != start or int(match[2]) < start:
                raise self._fail(f"answer to a range request has Content-Range "
                                 f"'{printable(headers.get('Content-Range', '')[:60])}', not bytes {start}-")
            total = None if match[3] == "*" else int(match[3])
            got = int(match[2]) + 1 - start
            want = end - start if total is None else min(end, total) - start
            if got < want:
                raise self._fail(f"the server sent bytes {start}-{match[2]} for a request of {start}-{end - 1}, "
                                 "short of the file's end: truncated answer")
            return min(got, end - start), total
        length = headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        return (end - start if total is None else min(end, total)), total

    def _body(self, response: Any, expected: int) -> bytes:
        """At most ``expected`` bytes of the body; an error if it ends before them."""
        chunks: list[bytes] = []
        got = 0
        for chunk in response.iter_raw(_CHUNK):
            take = chunk[: expected - got]
            chunks.append(take)
            got += len(take)
            self.log.bytes_read += len(take)
            if got >= expected:
                break
        if got < expected:
            raise self._fail(f"the answer ended after {got} of {expected} bytes: truncated")
        return b"".join(chunks)


def _retry_after(value: str | None) -> float | None:
    """A Retry-After of delta-seconds, cut to MAX_WAIT_S; None if absent or a date."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value), MAX_WAIT_S)
