"""The shipped Prometheus rules (``rules/flightrec-alerts.yml``) with absolute runbook links.

The file carries ``runbook_url: "RUNBOOK_BASE#<alertname lower-cased>"``; ``render`` puts the
deployment's base in place of the marker, the same base the sidecar's own alerts link to
(``alerting.runbook_base``), so that a page from either sender opens the same runbook. A pager
follows only an absolute URL: a base that is not ``http(s)://host...`` is refused. Pure text in,
text out: comments and layout stay as written.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from collector.errors import FlightrecError

MARKER = "RUNBOOK_BASE"
_URL = re.compile(r'(runbook_url:\s*")' + MARKER + r"#([a-z0-9-]+)(\")")
_ABSOLUTE = re.compile(r"^https?://[^/\s#?]+[^\s#]*$")


class RulesError(FlightrecError):
    """No usable runbook base, or no rules file."""


def check_base(base: str) -> str:
    """``base`` without a trailing slash, or ``RulesError`` when it is not an absolute URL."""
    base = base.strip().rstrip("/")
    if not _ABSOLUTE.match(base):
        raise RulesError(f"runbook base {base!r} is not an absolute http(s) URL (alerting.runbook_base or --runbook-base)")
    return base


def render(text: str, base: str) -> str:
    """The rules with every ``RUNBOOK_BASE#anchor`` link made ``<base>#anchor``."""
    base = check_base(base)
    out, n = _URL.subn(lambda m: f"{m.group(1)}{base}#{m.group(2)}{m.group(3)}", text)
    if n == 0:
        raise RulesError(f"no runbook_url with the {MARKER} marker in the rules")
    return out


def shipped_rules() -> Path:
    """``rules/flightrec-alerts.yml``: beside the package in a checkout, or installed as data
    under ``<prefix>/share/vllm-flight-recorder/rules``."""
    here = Path(__file__).resolve().parents[2] / "rules" / "flightrec-alerts.yml"
    if here.is_file():
        return here
    shared = Path(sys.prefix) / "share" / "vllm-flight-recorder" / "rules" / "flightrec-alerts.yml"
    if shared.is_file():
        return shared
    raise RulesError(f"the rules file is neither at {here} nor at {shared}")
