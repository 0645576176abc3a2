"""A remote GGUF (a URL, a file of a Hugging Face repo) read by its header only, with HTTP range requests.

The first ``FIRST_READ`` bytes are fetched and scanned by the local reader's scanner (``gguf_scan.scan_prefix``);
where the header goes on past them, the scanner says how far and the prefix grows (at least doubling, so a header
of H bytes costs at most about 2 H and a handful of requests), up to ``MAX_HEADER`` bytes. The same limits as for a
local file bound every count before any byte is fetched for it (a header that claims 10^12 tensors is refused from
its first 24 bytes), and the tensor data is only checked to lie inside the file's size. The scanned header then goes
through ``gguf_file.model_from_index``, the one place a GGUF header becomes a spec. A model split in parts
(``-00001-of-0000N.gguf``) has the other parts' tensor tables read the same way and summed.
"""

from __future__ import annotations

from collections.abc import Callable

from rsplan.errors import ModelFileError
from rsplan.hparams.gguf_file import GGUFModel, model_from_index
from rsplan.hparams.gguf_scan import GGUFIndex, NeedBytes, scan_prefix
from rsplan.hparams.gguf_split import split_part_names
from rsplan.hparams.remote import RangeReader, shown_url

#: Bytes fetched first (a model with a small vocabulary fits; a 150k-token one needs a few MiB).
FIRST_READ = 1 << 20
#: The most header bytes rsplan fetches from one remote GGUF (real headers: up to ~10 MiB for 256k-token
#: vocabularies with merges).
MAX_HEADER = 64 << 20


def read_header(reader: RangeReader, where: str) -> tuple[bytes, GGUFIndex]:
    """The header bytes (a prefix of the file) and the scanned index of the remote GGUF ``reader`` reads.

    Raises:
        ModelFileError: an HTTP failure, a server that does not say the file's size, a header past MAX_HEADER
            bytes, or anything the local reader refuses.
    """
    buf = reader.read(0, FIRST_READ)
    size = reader.size
    if size is None:
        if len(buf) == FIRST_READ:
            raise ModelFileError(f"{where}: the server does not say the file's size (no Content-Range or "
                                 "Content-Length), so the tensor data cannot be checked")
        size = len(buf)
    while True:
        try:
            return buf, scan_prefix(buf, size, where)
        except NeedBytes as more:
            if more.end > MAX_HEADER:
                raise ModelFileError(
                    f"{where}: the GGUF header goes on past {MAX_HEADER:,} bytes, the most rsplan fetches of a "
                    "remote file; download the file and give its path"
                ) from None
            target = min(size, MAX_HEADER, max(more.end, 2 * len(buf)))
            buf += reader.read(len(buf), target)
            if len(buf) < target:
                raise ModelFileError(f"{where}: the server sent {len(buf)} bytes of a {size}-byte file: "
                                     "truncated") from None


def read_remote_gguf(first: RangeReader, name: str, part: Callable[[str], RangeReader]) -> GGUFModel:
    """Read the remote GGUF ``first`` (file name ``name``) for sizing, as ``gguf_file.read_gguf`` reads a local one.

    ``part(file_name)`` gives the reader of another part of a split model (same folder).
    """
    where = shown_url(first.url)
    buf, index = read_header(first, where)
    parts = []
    for part_name in split_part_names(name, buf, index, where):
        reader = part(part_name)
        parts.append((shown_url(reader.url), read_header(reader, shown_url(reader.url))[1]))
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    return model_from_index(buf, index, where, fallback_name=stem, parts=parts)
