"""``--model ORG/NAME[@REVISION][:QUANT]``: a Hugging Face model repository, read as little as the answer needs.

* A repo with a config.json: the file list and the commit through huggingface_hub (``HfApi.model_info``);
  config.json from the hub cache, else fetched (bounded, and stored in the cache's layout), then
  ``hf_config.read_hf_config``; the weights exact, per dtype, from the safetensors headers (``model.safetensors``,
  or the shards ``model.safetensors.index.json`` names, else every ``*.safetensors`` at the root, as vLLM loads
  them), read from the cache where the file is there, else by HTTP range (the header only).
* A GGUF repo (``:QUANT`` given, or no config.json but GGUF files): the file chosen as llama.cpp's ``-hf`` chooses
  it (common/download.cpp ``find_best_model``), then its header (and the other split parts' tensor tables) read
  from the cache or by range, and ``gguf_file.model_from_index``.

The environment is read when called, as the hub client reads it: HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE (the cache
only: nothing is fetched), HF_HUB_CACHE / HF_HOME, HF_HUB_DOWNLOAD_TIMEOUT. huggingface_hub is imported on the first
hub reference only.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from rsplan.errors import ModelFileError, printable
from rsplan.files import path_kind
from rsplan.hparams import safetensors_header as st
from rsplan.hparams.remote import MAX_WAIT_S, RETRIES, FetchLog, RangeReader, http_module, timeout_s
from rsplan.hparams.yaml_preset import read_text_file

#: ``[hf.co/]ORG/NAME[@REVISION][:QUANT]`` (llama.cpp's -hf syntax, with a revision).
HUB_REF = re.compile(
    r"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96})"
    r"(?:@(?P<revision>[A-Za-z0-9_./-]{1,200}))?"
    r"(?::(?P<tag>[A-Za-z0-9_.-]{1,64}))?$"
)
#: llama.cpp's default tags when none is given, in order.
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
#: File names llama.cpp does not take for the model (gguf_filename_is_model).
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
#: Bytes fetched first of a safetensors file: the length and, for most shards, the whole header.
SAFETENSORS_FIRST_READ = 1 << 16
#: Shard headers fetched at once.
PARALLEL = 8
#: Shards of one model at most.
MAX_SHARDS = 4096
_TRUE = {"1", "on", "yes", "true"}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubRef:
    repo: str
    revision: str | None
    tag: str | None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "") + (f":{self.tag}" if self.tag else "")


def parse_hub_ref(ref: str) -> HubRef | None:
    """The hub reference ``ref`` names, or None if it is not one."""
    match = HUB_REF.match(ref)
    if match is None or any(part in (".", "..") for part in match["repo"].split("/")):
        return None
    return HubRef(match["repo"], match["revision"], match["tag"])


@dataclass(frozen=True)
class HubEnv:
    endpoint: str
    offline: bool
    token: str | None
    cache_dir: Path


def hub_env() -> HubEnv:
    """The hub settings from the environment, now."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        cache = os.path.join(home, "hub")
    return HubEnv(
        endpoint=(env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
        offline=env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE,
        token=env.get("HF_TOKEN") or None,
        cache_dir=Path(os.path.expanduser(os.path.expandvars(cache))),
    )


@dataclass
class Origin:
    """Where a hub model's facts came from (``rsplan inspect`` shows it).

    Attributes:
        repo, revision: the repository and the commit read.
        listing: "hub API" or "cache" (how the file list was had).
        files: per file read: path in the repo, "cache" or the URL, bytes fetched over HTTP.
        notes: facts that could not be read, and why.
    """

    repo: str
    revision: str
    listing: str
    files: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_fetched(self) -> int:
        return sum(f.get("bytes_fetched", 0) for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"form": "hub", "repo": self.repo, "revision": self.revision, "listing": self.listing,
                "files": self.files, "bytes_fetched": self.bytes_fetched, "requests": sum(
                    f.get("requests", 0) for f in self.files), "notes": self.notes}


def _hub() -> Any:
    try:
        import huggingface_hub  # deferred: huggingface_hub
    except ImportError:
        raise ModelFileError("a Hugging Face model id needs the huggingface_hub package: "
                             "pip install 'rsplan[hub]'") from None
    return huggingface_hub


def hub_error(ref: HubRef, exc: Exception, what: str = "") -> ModelFileError:
    """A one-line error for an exception huggingface_hub raised while reading ``ref``."""
    from huggingface_hub import errors as e  # deferred: huggingface_hub

    name = f"{ref.repo}{' ' + what if what else ''}"
    if isinstance(exc, e.GatedRepoError):
        return ModelFileError(f"{name}: a gated model: accept its terms on the hub, then set HF_TOKEN to a token "
                              "with access")
    if isinstance(exc, e.RevisionNotFoundError):
        return ModelFileError(f"{name}: no revision '{printable(ref.revision or 'main')}' in the repository")
    if isinstance(exc, e.RepositoryNotFoundError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        return ModelFileError(f"{name}: no such local path, and no such model on {hub_env().endpoint} (HTTP "
                              f"{status}; if it is private or gated, set HF_TOKEN)")
    if isinstance(exc, e.LocalEntryNotFoundError):
        return ModelFileError(f"{name}: not in the Hugging Face cache ({hub_env().cache_dir}) and cannot be "
                              "fetched" + (" (HF_HUB_OFFLINE is set)" if hub_env().offline else ""))
    if isinstance(exc, e.EntryNotFoundError):
        return ModelFileError(f"{name}: no such file in the repository")
    if isinstance(exc, e.OfflineModeIsEnabled):
        return ModelFileError(f"{name}: HF_HUB_OFFLINE is set and the file is not in the cache")
    if isinstance(exc, e.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        retried = status == 429 or (status or 0) >= 500
        return ModelFileError(f"{name}: HTTP {status} from {hub_env().endpoint}" + (
            ", 3 tries; try again later" if retried else ""))
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ModelFileError(f"{name}: cannot fetch from {hub_env().endpoint}: {printable(text[:200])}")


def _call(ref: HubRef, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its hub and network exceptions as one-line ModelFileErrors; 429 and 5xx answers
    are tried again, RETRIES tries in all (as the range reads)."""
    for attempt in range(1, RETRIES + 1):
        try:
            return _call_once(ref, what, fn, *args, **kwargs)
        except _Retry as retry:
            if attempt == RETRIES:
                raise hub_error(ref, retry.exc, what) from None
            time.sleep(min(MAX_WAIT_S, 0.25 * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")  # pragma: no cover


class _Retry(Exception):
    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _call_once(ref: HubRef, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from huggingface_hub import errors as e  # deferred: huggingface_hub

    http = http_module()
    try:
        return fn(*args, **kwargs)
    except ModelFileError:
        raise
    except e.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None) or 0
        if status == 429 or status >= 500:
            raise _Retry(exc) from None
        raise hub_error(ref, exc, what) from None
    except http.TimeoutException:
        raise ModelFileError(f"{ref.repo} {what}: the server sent nothing for {timeout_s():g} s "
                             "(HF_HUB_DOWNLOAD_TIMEOUT); timed out") from None
    except http.TooManyRedirects:
        raise ModelFileError(f"{ref.repo} {what}: too many redirects (a redirect loop?)") from None
    except (e.EntryNotFoundError, e.OfflineModeIsEnabled, http.HTTPError, OSError) as exc:
        raise hub_error(ref, exc, what) from None


# -- the file list -------------------------------------------------------------------------------------------------


def _cached_snapshot(ref: HubRef, env: HubEnv) -> tuple[str, Path] | None:
    """(commit, snapshot folder) of ``ref`` in the hub cache, or None."""
    repo_dir = env.cache_dir / ("models--" + ref.repo.replace("/", "--"))
    revision = ref.revision or "main"
    commit = revision
    if not _COMMIT.match(revision):
        ref_file = repo_dir / "refs" / revision
        try:
            if path_kind(ref_file) != "file":
                return None
            commit = ref_file.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if not _COMMIT.match(commit):
            return None
    snapshot = repo_dir / "snapshots" / commit
    try:
        return (commit, snapshot) if path_kind(snapshot) == "dir" else None
    except OSError:
        return None


def _snapshot_files(snapshot: Path) -> list[str]:
    files = []
    for root, _dirs, names in os.walk(snapshot):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), snapshot)
            files.append(PurePosixPath(*Path(rel).parts).as_posix())
    return sorted(files)


def list_repo(ref: HubRef, env: HubEnv) -> tuple[str, list[str], str, Path | None]:
    """(commit, files, how listed, cached snapshot folder or None) of ``ref``.

    Online: the hub API (model_info). Offline: the cache's snapshot of the revision.
    """
    cached = _cached_snapshot(ref, env)
    if env.offline:
        if cached is None:
            raise ModelFileError(f"{ref.repo}: not in the Hugging Face cache ({env.cache_dir}) and HF_HUB_OFFLINE is "
                                 "set; run once online, or unset HF_HUB_OFFLINE")
        return cached[0], _snapshot_files(cached[1]), "cache", cached[1]
    hf = _hub()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its warnings would break the one-line errors
    api = hf.HfApi(endpoint=env.endpoint, token=env.token)

    info = _call(ref, "(model info)", api.model_info, ref.repo, revision=ref.revision, timeout=timeout_s())
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not _COMMIT.match(sha):
        raise ModelFileError(f"{ref.repo}: the hub did not say which commit the revision is")
    files = sorted(s.rfilename for s in (info.siblings or []) if isinstance(getattr(s, "rfilename", None), str))
    snapshot = env.cache_dir / ("models--" + ref.repo.replace("/", "--")) / "snapshots" / sha
    return sha, files, "hub API", snapshot


# -- choosing the GGUF file (llama.cpp common/download.cpp) ---------------------------------------------------------


def _split_info(path: str) -> tuple[str, int, int]:
    """(prefix, index, count) of a GGUF file name (get_gguf_split_info)."""
    prefix = path[:-5] if path.endswith(".gguf") else path
    match = _SPLIT.match(prefix)
    if match:
        return match[1], int(match[2]), int(match[3])
    return prefix, 1, 1


def is_model_gguf(path: str) -> bool:
    """gguf_filename_is_model: a .gguf that is no projector, imatrix or draft sidecar."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in _NOT_MODEL)


def choose_gguf(files: list[str], tag: str | None) -> str | None:
    """The file llama.cpp's ``-hf REPO[:TAG]`` takes (find_best_model): the first model GGUF whose path contains
    TAG followed by '.' or '-' (any case), first parts of split models only; without a tag, Q4_K_M, then Q8_0,
    then the first model GGUF. None if nothing matches."""
    tags = [tag] if tag else list(DEFAULT_TAGS)
    candidates = [f for f in files if is_model_gguf(f) and not (_split_info(f)[2] > 1 and _split_info(f)[1] != 1)]
    for t in tags:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for f in candidates:
            if pattern.search(f):
                return f
    if not tag and candidates:
        return candidates[0]
    return None


def split_files(files: list[str], chosen: str) -> list[str]:
    """The chosen file and the other parts of its split model in the listing (get_split_files)."""
    prefix, _, count = _split_info(chosen)
    if count <= 1:
        return [chosen]
    return [f for f in files if _split_info(f)[0] == prefix and _split_info(f)[2] == count]


# -- reading -------------------------------------------------------------------------------------------------------


@dataclass
class HubModel:
    """A hub model read for sizing: ``kind`` "gguf" (``model`` a GGUFModel) or "hf" (an HFModel, with the weights
    from the safetensors headers in its spec), and where each fact came from."""

    kind: str
    model: Any
    origin: Origin
    dtype_bytes: dict[str, int] | None = None  # safetensors weights per dtype (config.json repos)


def _reader(ref: HubRef, env: HubEnv, commit: str, path: str, origin_file: dict[str, Any]) -> Any:
    """A RangeReader of ``path`` at ``commit``, counting into ``origin_file``."""
    from huggingface_hub import hf_hub_url  # deferred: huggingface_hub
    from huggingface_hub.utils import build_hf_headers  # deferred: huggingface_hub

    url = hf_hub_url(ref.repo, path, revision=commit, endpoint=env.endpoint)
    headers = build_hf_headers(token=env.token)
    log = FetchLog()
    origin_file.update(url=url, log=log)
    return RangeReader(url, headers, log, hint="set HF_TOKEN to a token with access")


def _finish_files(origin: Origin) -> None:
    for f in origin.files:
        log = f.pop("log", None)
        if log is not None:
            f["bytes_fetched"] = log.bytes_read
            f["requests"] = log.requests


def safe_repo_path(path: str) -> bool:
    """A file path inside a repo: relative, '/'-separated, without '.' or '..' parts (a hostile listing or index
    cannot name a file outside the snapshot)."""
    return bool(path) and "\\" not in path and "\0" not in path and all(
        part not in ("", ".", "..") for part in path.split("/"))


def _local(snapshot: Path | None, path: str) -> Path | None:
    if not safe_repo_path(path):
        raise ModelFileError(f"repository file '{printable(path[:200])}': not a relative path inside the repository")
    if snapshot is None:
        return None
    local = snapshot / path
    try:
        return local if path_kind(local) == "file" else None
    except OSError:
        return None


def _read_gguf(ref: HubRef, env: HubEnv, commit: str, files: list[str], snapshot: Path | None,
               origin: Origin) -> HubModel:
    from rsplan.hparams.gguf_file import read_gguf  # deferred: the GGUF reader imports pydantic (llama_loader)

    chosen = choose_gguf(files, ref.tag)
    if chosen is None:
        shown = ", ".join(f for f in files if f.endswith(".gguf"))[:300] or "none"
        raise ModelFileError(f"{ref}: no GGUF file matches " + (f"the tag '{ref.tag}'" if ref.tag else "")
                             + f" (GGUF files: {shown})")
    parts = split_files(files, chosen)
    local = [_local(snapshot, p) for p in parts]
    if all(local):
        origin.files = [{"path": p, "from": "cache", "file": str(loc)} for p, loc in zip(parts, local, strict=True)]
        return HubModel("gguf", read_gguf(local[0]), origin)  # type: ignore[arg-type]
    if env.offline:
        raise ModelFileError(f"{ref}: {chosen} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    from rsplan.hparams.remote_gguf import read_remote_gguf  # deferred: the GGUF reader imports pydantic (llama_loader)

    folder = chosen.rsplit("/", 1)[0] + "/" if "/" in chosen else ""
    by_name = {p.rsplit("/", 1)[-1]: p for p in parts}
    origin.files = [{"path": chosen}]
    first = _reader(ref, env, commit, chosen, origin.files[0])

    def part(name: str) -> Any:
        path = by_name.get(name, folder + name)
        if path not in files:
            raise ModelFileError(f"{ref}: split part {path} is not in the repository")
        entry: dict[str, Any] = {"path": path}
        origin.files.append(entry)
        return _reader(ref, env, commit, path, entry)

    model = read_remote_gguf(first, chosen.rsplit("/", 1)[-1], part)
    return HubModel("gguf", model, origin)


#: The most bytes of a small JSON file (config.json, the safetensors index) rsplan fetches.
MAX_JSON_FETCH = 16 << 20


def _store(target: Path, data: bytes) -> str | None:
    """Write ``data`` to ``target`` atomically (a temporary file beside it, then a rename); the reason if it could
    not be written (a read-only cache is no error: the file was read)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.incomplete")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        return f"{target}: not written to the cache: {exc.strerror or exc}"
    return None


def _download(ref: HubRef, env: HubEnv, commit: str, path: str, snapshot: Path | None, origin: Origin) -> Path:
    """A small file of the repo (config.json, the safetensors index): from the hub cache if there, else fetched
    (bounded, retried as every remote read) and stored in the cache's layout, as llama.cpp's hf-cache stores what it
    fetches: ``snapshots/<commit>/<path>`` and ``refs/<revision>``, each written atomically."""
    local = _local(snapshot, path)
    if local is not None:
        origin.files.append({"path": path, "from": "cache", "file": str(local)})
        return local
    if env.offline or snapshot is None:
        raise ModelFileError(f"{ref.repo}: {path} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    entry: dict[str, Any] = {"path": path}
    origin.files.append(entry)
    reader = _reader(ref, env, commit, path, entry)
    data = reader.read(0, MAX_JSON_FETCH + 1)
    if len(data) > MAX_JSON_FETCH:
        raise ModelFileError(f"{ref.repo}: {path} has more than the {MAX_JSON_FETCH:,} bytes allowed")
    target = snapshot / path
    problem = _store(target, data)
    revision = ref.revision or "main"
    if problem is None and revision != commit and safe_repo_path(revision):
        problem = _store(snapshot.parent.parent / "refs" / revision, commit.encode())
    if problem is None:
        return target
    origin.notes.append(problem)

    folder = Path(tempfile.mkdtemp(prefix="rsplan-hub-"))
    (folder / path.rsplit("/", 1)[-1]).write_bytes(data)
    return folder / path.rsplit("/", 1)[-1]


def weight_files(ref: HubRef, env: HubEnv, commit: str, files: list[str], snapshot: Path | None,
                 origin: Origin) -> tuple[list[str], str]:
    """The safetensors files a serving engine loads, and why those: the shards of model.safetensors.index.json,
    else model.safetensors, else every *.safetensors at the root."""
    if "model.safetensors.index.json" in files:
        path = _download(ref, env, commit, "model.safetensors.index.json", snapshot, origin)
        from rsplan.hparams.hf_base import parse_json_text  # deferred: pydantic (llama_loader)
        from rsplan.hparams.hf_config import MAX_CONFIG_BYTES  # deferred: pydantic (the config.json reader)

        data = parse_json_text(read_text_file(path, MAX_CONFIG_BYTES * 16), path)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelFileError(f"{ref.repo}: model.safetensors.index.json: weight_map is not an object of file "
                                 "names")
        shards = sorted(set(weight_map.values()))
        if len(shards) > MAX_SHARDS:
            raise ModelFileError(f"{ref.repo}: model.safetensors.index.json names {len(shards)} files, more than "
                                 f"{MAX_SHARDS}")
        for shard in shards:
            if shard not in files and not env.offline:  # offline, the listing is the cache's: checked later
                raise ModelFileError(f"{ref.repo}: model.safetensors.index.json names {printable(shard[:100])}, "
                                     "which is not in the repository")
        return shards, "model.safetensors.index.json"
    if "model.safetensors" in files:
        return ["model.safetensors"], "model.safetensors"
    if env.offline:  # the listing is the cache's: the root files there may be some shards of many
        return [], ("HF_HUB_OFFLINE is set and neither model.safetensors.index.json nor model.safetensors is in "
                    "the cache")
    return [f for f in files if f.endswith(".safetensors") and "/" not in f], "*.safetensors"


def _safetensors_header(ref: HubRef, env: HubEnv, commit: str, path: str, snapshot: Path | None,
                        entry: dict[str, Any]) -> Any:
    local = _local(snapshot, path)
    if local is not None:
        entry.update({"from": "cache", "file": str(local)})
        return st.read_local(local)
    reader = _reader(ref, env, commit, path, entry)
    where = entry["url"]
    head = reader.read(0, SAFETENSORS_FIRST_READ)
    n = st.header_length(head, where)
    if 8 + n > len(head):
        head += reader.read(len(head), 8 + n)
    if len(head) < 8 + n:
        raise ModelFileError(f"{where}: header of {n} bytes, the file has {reader.size}: truncated")
    return st.parse_header(head[8 : 8 + n], where, reader.size)


def _read_config_repo(ref: HubRef, env: HubEnv, commit: str, files: list[str], snapshot: Path | None,
                      origin: Origin) -> HubModel:
    from rsplan.hparams.hf_config import read_hf_config  # deferred: pydantic (the config.json reader)
    from rsplan.hparams.llama_loader import LoadedModel  # deferred: pydantic

    # the index first: beside config.json in the cache, the config reader counts Qwen3-Next's MTP layers from it
    shards, why = weight_files(ref, env, commit, files, snapshot, origin)
    config = _download(ref, env, commit, "config.json", snapshot, origin)
    h = read_hf_config(config, repo_files=files)
    dtype_bytes: dict[str, int] | None = None
    sources = dict(h.loaded.sources)
    missing = [s for s in shards if _local(snapshot, s) is None]
    if not shards:
        origin.notes.append(("no safetensors weights in the repository" if why == "*.safetensors" else why)
                            + ": weights_bytes unknown")
    elif env.offline and missing:
        origin.notes.append(f"HF_HUB_OFFLINE is set and {len(missing)} of {len(shards)} safetensors files are not "
                            "in the cache: weights_bytes unknown")
    else:
        entries = [{"path": s} for s in shards]
        origin.files += entries
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(shards))) as pool:
            headers = list(pool.map(lambda se: _safetensors_header(ref, env, commit, se[0], snapshot, se[1]),
                                    zip(shards, entries, strict=True)))
        dtype_bytes = {}
        for header in headers:
            for dtype, n in header.dtype_bytes.items():
                dtype_bytes[dtype] = dtype_bytes.get(dtype, 0) + n
        dtype_bytes = dict(sorted(dtype_bytes.items()))
        sources["weights_bytes"] = (f"safetensors headers ({sum(x.n_tensors for x in headers)} tensors in "
                                    f"{len(shards)} files, from {why})")
    name = ref.repo.rsplit("/", 1)[-1]
    update: dict[str, Any] = {"name": name, "source": f"hf.co/{ref.repo}@{commit} config.json" + (
        ", weights from the safetensors headers (the checkpoint's bytes, as vLLM / SGLang load them)"
        if dtype_bytes is not None else "")}
    if dtype_bytes is not None:
        update["weights_bytes"] = sum(dtype_bytes.values())
    spec = h.spec.model_copy(update=update)
    h = replace(h, loaded=LoadedModel(spec.model_validate(spec.model_dump()), sources))
    return HubModel("hf", h, origin, dtype_bytes)


def read_hub(ref: HubRef) -> HubModel:
    """Read the hub model ``ref`` for sizing (see the module).

    Raises:
        ModelFileError: no such repo, revision or file, no access, an HTTP failure, offline with nothing cached,
            or anything the local readers refuse in what was fetched.
    """
    env = hub_env()
    commit, files, listing, snapshot = list_repo(ref, env)
    origin = Origin(ref.repo, commit, listing)
    try:
        if ref.tag or ("config.json" not in files and any(is_model_gguf(f) for f in files)):
            return _read_gguf(ref, env, commit, files, snapshot, origin)
        if "config.json" not in files:
            raise ModelFileError(f"{ref}: the repository has no config.json and no GGUF file")
        return _read_config_repo(ref, env, commit, files, snapshot, origin)
    finally:
        _finish_files(origin)
