"""Content-coding negotiation: does the client take gzip? (RFC 9110 section 12.5.3)

``Accept-Encoding: gzip;q=0`` means "not gzip": a substring test answered it with gzip. A coding
is acceptable when it is listed with a q-value above 0, or when it is not listed and ``*`` is
(with q above 0). A q-value we cannot read counts as 0: we then send identity, which every
client can read.
"""

from __future__ import annotations

_GZIP = ("gzip", "x-gzip")


def _qvalue(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def accepts_gzip(header: str | None) -> bool:
    if not header:
        return False
    listed: float | None = None
    star: float | None = None
    for item in header.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        if coding in _GZIP:
            listed = max(listed or 0.0, _qvalue(params))
        elif coding == "*":
            star = _qvalue(params)
    if listed is not None:
        return listed > 0
    return star is not None and star > 0
