"""Query parameters every list endpoint shares: times and the page cursor.

Times (``since``, ``until``) are unix seconds (``1757760067.5``) or RFC 3339
(``2025-09-13T10:41:07Z``, ``2025-09-13T12:41:07.250+02:00``); a stamp without an offset is
refused rather than guessed. One pagination everywhere: a list is ``{"items": [...],
"next_cursor": ...}`` (the cursor also in an ``X-Next-Cursor`` header), and ``cursor`` takes the
previous page's ``next_cursor``; ``before_id`` still works where it did.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated

from fastapi import HTTPException, Query

TIME_HELP = "unix seconds or RFC 3339 (e.g. 2025-09-13T10:41:07Z)"
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

TimeQuery = Annotated[str | None, Query(max_length=40, description=TIME_HELP, examples=["2025-09-13T10:41:07Z"])]
CursorQuery = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]
BeforeIdQuery = Annotated[int | None, Query(ge=1, le=2**62, deprecated=True, description="older name of cursor (an id)")]


def _invalid(name: str, msg: str) -> HTTPException:
    # The body FastAPI gives any other invalid parameter, which the OpenAPI 422 schema declares
    # (schemathesis found the plain-string detail off that schema).
    return HTTPException(422, [{"type": "value_error", "loc": ["query", name], "msg": msg}])


def parse_time(name: str, value: str | None) -> float | None:
    """Unix seconds from either form; 422 naming the parameter otherwise."""
    if value is None or value == "":
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        if not _RFC3339.match(text):
            raise _invalid(name, f"{name}: {value!r} is neither unix seconds nor RFC 3339 with an offset") from None
        try:  # the pattern admits month 13 or year 0, which fromisoformat refuses (a 500 before)
            seconds = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            raise _invalid(name, f"{name}: {value!r} is not a valid date") from None
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise _invalid(name, f"{name}: {value!r} is not a time")
    return seconds


def time_range(since: str | None, until: str | None) -> tuple[float | None, float | None]:
    lo, hi = parse_time("since", since), parse_time("until", until)
    if lo is not None and hi is not None and hi <= lo:
        raise HTTPException(400, "until must be after since")
    return lo, hi


def id_cursor(cursor: str | None, before_id: int | None) -> int | None:
    """The id pages of events and incidents continue below (cursor wins over before_id)."""
    if cursor is None:
        return before_id
    # ASCII digits only: str.isdigit() admits "²", which int() refuses (a 500, found by schemathesis)
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 19 or not 1 <= int(cursor) <= 2**62:
        raise HTTPException(400, f"cursor: {cursor[:40]!r} is not a cursor this endpoint gave")
    return int(cursor)
