"""The dashboard linted as Grafana's dashboard-linter lints a mixin's dashboards (its rules,
checked here without a Grafana server or the linter's binary):

- panel-units: every panel that plots numbers says their unit;
- panel-description: every panel says what it shows;
- target-rate-interval: a rate window is ``$__rate_interval`` (a stat's "in range" figure may
  take ``$__range``, the whole selected range);
- target-counter-agg: a counter (``_total``) only inside ``rate``/``irate``/``increase``, or in
  the one form that counts a series born at its first event, ``(X unless X offset W)``;
- template-datasource: every panel's datasource is a datasource variable, never a fixed uid;
- template-instance: every sidecar series is filtered by the ``$instance`` variable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "flightrec.json"

NUMERIC_PANELS = {"timeseries", "stat", "gauge", "bargauge", "state-timeline", "barchart", "heatmap"}
RATE_FUNCTIONS = ("rate", "irate", "increase")
# `(X{...} unless X offset W)`: a counter series new within W, counted whole (it was born at 1)
BORN_AT_FIRST_EVENT = re.compile(r"\((\w[\w:]*_total)(\{[^}]*\})? unless \1 offset [^)]+\)")
COUNTER = re.compile(r"[A-Za-z_:][\w:]*_total\b")


def panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def prom_targets() -> Iterator[tuple[dict[str, Any], str]]:
    for panel in panels():
        for t in panel.get("targets", []):
            ds = t.get("datasource") or panel.get("datasource") or {}
            if ds.get("type") == "prometheus":
                yield panel, t["expr"]


def name(panel: dict[str, Any]) -> str:
    return f"panel {panel.get('id')} {panel.get('title')!r}"


def test_every_panel_that_plots_numbers_has_a_unit() -> None:
    missing = [name(p) for p in panels() if p["type"] in NUMERIC_PANELS and not p.get("fieldConfig", {}).get("defaults", {}).get("unit")]
    assert missing == []


def test_every_panel_has_a_description() -> None:
    missing = [name(p) for p in panels() if p["type"] != "row" and not (p.get("description") or "").strip()]
    assert missing == []


def test_rate_windows_are_the_rate_interval() -> None:
    bad = []
    for panel, expr in prom_targets():
        for window in re.findall(r"\[([^\]]+)\]", expr):
            if window == "$__rate_interval" or (window == "$__range" and panel["type"] == "stat"):
                continue
            bad.append(f"{name(panel)}: [{window}] in {expr}")
    assert bad == []


def _outside_rate(expr: str) -> list[str]:
    """Counter names in ``expr`` not directly inside rate/irate/increase."""
    expr = BORN_AT_FIRST_EVENT.sub("(born)", expr)
    out = []
    for m in COUNTER.finditer(expr):
        before = expr[: m.start()].rstrip()
        if not any(before.endswith(f"{fn}(") for fn in RATE_FUNCTIONS):
            out.append(m.group())
    return out


def test_counters_only_inside_rate_or_increase() -> None:
    bad = [f"{name(panel)}: {c}" for panel, expr in prom_targets() for c in _outside_rate(expr)]
    assert bad == []


@pytest.mark.parametrize(
    ("expr", "bad"),
    [
        ("sum(rate(x_total[$__rate_interval]))", []),
        ("sum(x_total)", ["x_total"]),
        ('(x_total{a="1"} unless x_total offset $__range) or increase(x_total{a="1"}[$__range])', []),
        ("x_total unless y_total offset 5m", ["x_total", "y_total"]),
    ],
)
def test_the_counter_check_itself(expr: str, bad: list[str]) -> None:
    assert _outside_rate(expr) == bad


def test_every_datasource_is_a_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dash["templating"]["list"] if v["type"] == "datasource"}
    assert variables
    bad = []
    for panel in panels():
        for ds in [panel.get("datasource"), *(t.get("datasource") for t in panel.get("targets", []))]:
            if ds and not re.fullmatch(r"\$\{(\w+)\}", str(ds.get("uid", ""))):
                bad.append(f"{name(panel)}: {ds}")
            elif ds and ds["uid"][2:-1] not in variables:
                bad.append(f"{name(panel)}: {ds['uid']} is no datasource variable")
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert re.fullmatch(r"\$\{\w+\}", v["datasource"]["uid"]), v["name"]
    assert bad == []


def test_every_sidecar_series_is_filtered_by_the_instance_variable() -> None:
    bad = []
    for panel, expr in prom_targets():
        stripped = BORN_AT_FIRST_EVENT.sub(lambda m: f"({m.group(1)}{m.group(2) or ''})", expr)
        for m in re.finditer(r"\b(flightrec_[\w]+)(\{[^}]*\})?", stripped):
            if m.group(1) == "flightrec_engine":  # the label vLLM's scrape carries, not a series
                continue
            if 'instance=~"$instance"' not in (m.group(2) or ""):
                bad.append(f"{name(panel)}: {m.group(1)}")
    assert bad == []
