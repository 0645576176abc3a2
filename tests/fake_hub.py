"""A small fake Hugging Face hub on 127.0.0.1, for tests that must not touch the internet.

It serves what ``huggingface_hub`` and rsplan ask of the hub: ``/api/models/<repo>[/revision/<rev>]`` (model_info:
the commit and the file list), ``/<repo>/resolve/<rev>/<path>`` with HEAD and GET, byte ranges, ETag /
X-Repo-Commit / X-Linked-Size headers, and a 302 to ``/cdn/...`` for large ("LFS") files, as the hub does. Files are
bytes or paths on disk (sparse GGUF files: only the ranges asked for are read). Faults are set per file path or per
repo: an HTTP status (all requests or the first N), a stall, a truncated body, a redirect loop, a server that
ignores Range. Every body byte sent is counted per path, so a test can assert what a read cost.

The server binds an ephemeral port, runs in a daemon thread and is shut down by the ``fake_hub`` fixture.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

#: Files at least this large are "LFS" files: resolve/ redirects them to /cdn/ (real hub: all LFS files).
LFS_MIN = 1 << 20


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up early (it read the header it wanted) is not a server error


@dataclass
class Fault:
    """What to do instead of answering a request for a path.

    kind: "status" (answer ``status``), "stall" (sleep ``seconds`` before any byte), "truncate" (declare the full
    range but send ``keep`` bytes and close), "loop" (redirect to itself), "no_range" (answer 200 with the whole
    file, ignoring Range). ``times``: how many requests the fault hits (None: all).
    """

    kind: str
    status: int = 500
    seconds: float = 0.0
    keep: int = 0
    times: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Repo:
    files: dict[str, bytes | Path]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False


class FakeHub:
    """The server's state: repos, faults, counters. ``url`` is its endpoint (HF_ENDPOINT)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults: dict[str, Fault] = {}  # file path in a repo, or "api:<repo>"
        self.token = "hf_secret"
        self.sent: dict[str, int] = {}  # path -> body bytes sent
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.auth_seen: dict[str, str | None] = {}  # path -> the Authorization header of its last request
        self.cdn_host = "127.0.0.1"  # "localhost": the /cdn/ redirect leaves the hub's origin, as to a real CDN
        self.lock = threading.Lock()
        self.server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo: str, files: dict[str, bytes | Path], **kw: Any) -> Repo:
        self.repos[repo] = Repo(files, **kw)
        return self.repos[repo]

    def bytes_sent(self, suffix: str = "") -> int:
        with self.lock:
            return sum(n for p, n in self.sent.items() if p.endswith(suffix))

    def fault(self, key: str) -> Fault | None:
        with self.lock:
            f = self.faults.get(key)
            if f is None:
                return None
            if f.times is not None:
                if f.times <= 0:
                    return None
                f.times -= 1
            return f


def _size(data: bytes | Path) -> int:
    return len(data) if isinstance(data, bytes) else data.stat().st_size


def _slice(data: bytes | Path, start: int, end: int) -> bytes:
    if isinstance(data, bytes):
        return data[start:end]
    with data.open("rb") as fh:
        fh.seek(start)
        return fh.read(end - start)


def _etag(data: bytes | Path) -> str:
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha256(f"{data}:{data.stat().st_size}".encode()).hexdigest()


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"hub": hub})


class _Handler(BaseHTTPRequestHandler):
    """The fake Hub's HTTP handler; ``_handler`` subclasses it for one hub."""

    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _error(self, status: int, code: str | None = None) -> None:
        self._json(status, {"error": code or "error"}, {"X-Error-Code": code} if code else {})

    def _authorized(self, repo: Repo) -> bool:
        return not repo.gated or self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _apply(self, fault: Fault | None, path: str) -> bool:
        """Answer with the fault; True if the request is done."""
        if fault is None:
            return False
        if fault.kind == "status":
            self._json(fault.status, {"error": "fault"}, fault.headers)
            return True
        if fault.kind == "stall":
            time.sleep(fault.seconds)
            self.close_connection = True
            return True
        if fault.kind == "loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        return False

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range")))
            self.hub.auth_seen[path] = self.headers.get("Authorization")
        m = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/(.+))?$", path)
        if m:
            return self._api(m[1], m[2])
        m = re.match(r"^/(cdn/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self._resolve(m[2], m[3], m[4], cdn=bool(m[1]))
        self._error(404)

    def _api(self, name: str, revision: str | None) -> None:
        if self._apply(self.hub.fault(f"api:{name}"), name):
            return
        repo = self.hub.repos.get(name)
        if repo is None:
            return self._error(401 if not self.headers.get("Authorization") else 404, "RepoNotFound")
        if not self._authorized(repo):
            return self._error(401, "GatedRepo")
        if revision not in (None, "main", repo.commit):
            return self._error(404, "RevisionNotFound")
        self._json(200, {"id": name, "modelId": name, "sha": repo.commit, "private": False,
                         "siblings": [{"rfilename": f} for f in sorted(repo.files)]})

    def _resolve(self, name: str, revision: str, file: str, *, cdn: bool) -> None:
        repo = self.hub.repos.get(name)
        if repo is None:
            return self._error(404, "RepoNotFound")
        if not self._authorized(repo) and not cdn:
            return self._error(401, "GatedRepo")
        if revision not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound")
        data = repo.files.get(file)
        if data is None:
            return self._error(404, "EntryNotFound")
        fault = self.hub.fault(file)
        if self._apply(fault, file):
            return
        size = _size(data)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{_etag(data)}"', "Accept-Ranges": "bytes"}
        if size >= LFS_MIN and not cdn:
            headers.update({"X-Linked-Etag": f'"{_etag(data)}"', "X-Linked-Size": str(size),
                            "Location": f"http://{self.hub.cdn_host}:{self.server.server_address[1]}"
                                        f"/cdn/{name}/resolve/{repo.commit}/{file}"})
            self.send_response(302)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end, status = 0, size, 200
        rng = _RANGE.match(self.headers.get("Range", ""))
        if rng and not (fault and fault.kind == "no_range"):
            start = int(rng[1])
            end = min(size, int(rng[2]) + 1) if rng[2] else size
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault and fault.kind == "truncate":
            end = start + fault.keep
            self.close_connection = True
        with self.hub.lock:  # counted before sending, so a test sees it as soon as its client has read the body
            self.hub.sent[file] = self.hub.sent.get(file, 0) + end - start
        try:
            for pos in range(start, end, 1 << 16):
                self.wfile.write(_slice(data, pos, min(end, pos + (1 << 16))))
        except (BrokenPipeError, ConnectionResetError):
            pass
