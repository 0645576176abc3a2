"""The profiler results ``rsplan report --profile FILE`` accepts, validated before anything is drawn.

Shape (docs/report.md), one JSON object:

    {
      "device": "NVIDIA H200",                       optional: where it ran
      "model": "qwen3-next-80b-a3b",                 optional
      "kernels": [                                   required, 1..1000 entries
        {"name": "gdn_scan f32",                     required: non-empty text
         "gbps": 1873.2,                             required: achieved GB/s (10^9 B/s), finite, >= 0
         "copy_gbps": 3950.0,                        required: the device's measured copy bandwidth, > 0
         "inplace_gbps": 4400.0,                     optional: its in-place (read-modify-write) bandwidth, > 0
         "bytes": 123456789,                         optional: bytes the kernel moves
         "time_s": 6.59e-05,                         optional: seconds per call
         "dtype": "f32",                             optional: state type
         "flag": "above 100% of in place is ..."}    optional: why the ratio is a measurement problem
      ]
    }

Any other key, a wrong type, NaN/Infinity, or a file that is not such an object is refused with a one-line error
naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rsplan.errors import RsplanError, key_name
from rsplan.files import FileTooLargeError, JSONValueError, parse_json, read_limited

#: The largest profile file read.
MAX_PROFILE_BYTES = 16 << 20

_Number = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class KernelResult(_Strict):
    """One kernel's measurement."""

    name: str = Field(min_length=1, max_length=200)
    gbps: Annotated[_Number, Field(ge=0)]
    copy_gbps: Annotated[_Number, Field(gt=0)]
    inplace_gbps: Annotated[_Number, Field(gt=0)] | None = None
    bytes: Annotated[int, Field(ge=0, le=1 << 60)] | None = None
    time_s: Annotated[_Number, Field(ge=0)] | None = None
    dtype: str | None = Field(None, max_length=20)
    flag: str | None = Field(None, min_length=1, max_length=300)

    @property
    def copy_ratio(self) -> float:
        """Achieved bandwidth as a fraction of the measured copy bandwidth."""
        return self.gbps / self.copy_gbps

    @property
    def inplace_ratio(self) -> float | None:
        """Achieved bandwidth as a fraction of the measured in-place bandwidth (None: not measured). A state
        update reads and writes its rows in place, so this is the like-for-like ratio; a copy also reads its
        destination for ownership, so the copy ratio of an in-place kernel can pass 1."""
        return None if self.inplace_gbps is None else self.gbps / self.inplace_gbps


class ProfileResults(_Strict):
    """A profiler run: what ``rsplan report --profile`` draws."""

    device: str | None = Field(None, max_length=200)
    model: str | None = Field(None, max_length=200)
    kernels: list[KernelResult] = Field(min_length=1, max_length=1000)


class ProfileFileError(RsplanError):
    """A --profile file that is missing, unreadable or not of the accepted shape."""


def _message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key (accepted: name, gbps, copy_gbps, inplace_gbps, bytes, time_s, dtype, flag in each " \
              "kernel; device, model, kernels at the top)"
        if key_name(err["loc"][-1]) is None:  # not a name: described, never shown (rsplan.errors.key_name)
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][:-1]).lstrip(".")
            msg = "a key that is not a name: " + msg
    return f"{loc}: {msg}" if loc else msg


def load_profile(path: str | Path) -> ProfileResults:
    """Read and validate a profile JSON file; ProfileFileError (one line) if it is not of the accepted shape."""
    path = Path(path)
    where = f"--profile {path}"
    try:
        text = read_limited(path, MAX_PROFILE_BYTES).decode("utf-8")
    except FileTooLargeError as exc:
        if exc.size is None:  # a /proc-like file that reports no size
            raise ProfileFileError(f"{where}: more than the {MAX_PROFILE_BYTES} bytes allowed") from None
        raise ProfileFileError(f"{where}: {exc.size} bytes, more than the {MAX_PROFILE_BYTES} allowed") from None
    except OSError as exc:
        raise ProfileFileError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ProfileFileError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = parse_json(text, allow_nan=False)
    except json.JSONDecodeError as exc:
        raise ProfileFileError(f"{where}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except JSONValueError as exc:
        raise ProfileFileError(f"{where}: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileFileError(f"{where}: expected a JSON object with a 'kernels' list, got {type(data).__name__}")
    try:
        return ProfileResults.model_validate(data)
    except ValidationError as exc:
        raise ProfileFileError(f"{where}: {_message(exc)}") from None
