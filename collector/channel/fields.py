"""Internal: typed reads of the fields of a JSON ring record; anything else raises ``FieldError``.

A JSON record is written by our recorder, but the ring file is readable by anyone who can
write into the recorder folder, and a bug on the engine side must not become a value the
database refuses (a string ``xid``, a step of 2**70 in a BIGINT column, ``kv_cache_usage:
"abc"``): that batch would fail, be retried, and stop every later row. So each field is checked
here against the column it ends in, and the codec turns a ``FieldError`` into a ``CodecError``:
the record is set aside and counted, never stored.
"""

from __future__ import annotations

import math
from typing import Any

from collector.errors import InputError

INT32_MAX = 2**31 - 1  # Integer columns (running, waiting, xid, pid, ...)
INT64_MAX = 2**63 - 1  # BigInteger columns (step) and JSON numbers SQLite can hold
NAME_MAX = 128  # String(128) columns: engine, gpu, process


class FieldError(InputError):
    """A field of a JSON record has the wrong type or is out of range."""


def integer(body: dict[str, Any], key: str, *, hi: int = INT32_MAX, default: int | None = None) -> int:
    value = body.get(key, default)
    if value is None:
        raise FieldError(f"{key} is missing")
    return check_int(key, value, hi=hi)


def optional_integer(body: dict[str, Any], key: str, *, hi: int = INT32_MAX) -> int | None:
    value = body.get(key)
    return None if value is None else check_int(key, value, hi=hi)


def check_int(key: str, value: Any, *, hi: int = INT32_MAX) -> int:
    # bool is an int subclass: True is not a count. A float with an integral value (JSON from
    # another language may print 3.0) is accepted.
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"{key} is not an integer: {type(value).__name__}")
    if not 0 <= value <= hi:
        raise FieldError(f"{key} is out of range 0..{hi}")
    return value


def number(body: dict[str, Any], key: str, *, lo: float = 0.0, hi: float = math.inf, default: float | None = None) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"{key} is not a number: {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out) or not lo <= out <= hi:
        raise FieldError(f"{key} is not a finite number in {lo}..{hi}")
    return out


def timestamp(body: dict[str, Any], key: str = "ts", *, default: float | None = None) -> float:
    return number(body, key, default=default)


def text(body: dict[str, Any], key: str, *, default: str | None = None, limit: int | None = None) -> str:
    value = body.get(key)
    if value is None:  # null is how Event.to_dict writes an unset engine
        value = default
    if value is None:
        raise FieldError(f"{key} is missing")
    return check_text(key, value, limit=limit)


def optional_text(body: dict[str, Any], key: str, *, limit: int | None = NAME_MAX) -> str | None:
    value = body.get(key)
    return None if value is None else check_text(key, value, limit=limit)


def check_text(key: str, value: Any, *, limit: int | None = None) -> str:
    if not isinstance(value, str):
        raise FieldError(f"{key} is not a string: {type(value).__name__}")
    if limit is not None and (len(value) > limit or "\x00" in value):
        raise FieldError(f"{key} is not a name of at most {limit} characters without NUL")
    return value


def mapping(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(f"{key} is not an object: {type(value).__name__}")
    return value


def sequence(body: dict[str, Any], key: str, item: type) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
        raise FieldError(f"{key} is not a list of {item.__name__}")
    return value
