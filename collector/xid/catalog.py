"""The Xid catalog: what an Xid code means, how bad it is and what to do, as data.

The table lives in ``collector/xid/catalog.json`` so that it can be reviewed and
extended without touching code; this module only loads it and answers ``lookup(code)``.
Unknown codes get the catalog's ``default`` entry (with ``known=False``), never an error.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from collector.errors import InputError
from collector.model import Severity

PACKAGED = Path(__file__).parent / "catalog.json"
CATEGORIES = frozenset({"application", "driver", "hardware", "nvlink", "memory", "thermal"})


class XidCatalogError(InputError):
    """The catalog file is missing a field or has a value outside its vocabulary."""


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    severity: Severity
    category: str
    action: str
    known: bool = True

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["severity"] = self.severity.value
        return out


class XidCatalog:
    def __init__(self, entries: dict[int, XidInfo], default: XidInfo) -> None:
        self._entries = entries
        self._default = default

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> XidCatalog:
        try:
            default = _entry(-1, raw["default"], known=False)
            entries = {int(code): _entry(int(code), body) for code, body in raw["codes"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise XidCatalogError(f"bad Xid catalog: {exc}") from exc
        return cls(entries, default)

    @classmethod
    def load(cls, path: Path | None = None) -> XidCatalog:
        """Load a catalog file; the packaged one when ``path`` is None."""
        if path is None:
            path = PACKAGED
        text = path.read_text("utf-8")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise XidCatalogError(f"Xid catalog is not JSON: {exc}") from exc
        return cls.from_dict(raw)

    def lookup(self, code: int) -> XidInfo:
        info = self._entries.get(code)
        if info is not None:
            return info
        d = self._default
        return XidInfo(code, d.name, d.meaning, d.severity, d.category, d.action, known=False)

    def codes(self) -> list[int]:
        return sorted(self._entries)


def _entry(code: int, body: dict[str, Any], *, known: bool = True) -> XidInfo:
    category = body["category"]
    if category not in CATEGORIES:
        raise ValueError(f"Xid {code}: unknown category {category!r}")
    return XidInfo(
        code=code,
        name=str(body["name"]),
        meaning=str(body["meaning"]),
        severity=Severity(body["severity"]),
        category=category,
        action=str(body["action"]),
        known=known,
    )


@lru_cache(maxsize=1)
def default_catalog() -> XidCatalog:
    return XidCatalog.load()


def lookup(code: int) -> XidInfo:
    """``lookup(43).action`` -> "restart the application; ..." (packaged catalog)."""
    return default_catalog().lookup(code)
