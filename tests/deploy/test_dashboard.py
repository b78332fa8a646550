"""The provisioned Grafana dashboard, checked without a Grafana server: its structure, every
PromQL expression through promtool, every SQL panel against the real Postgres (after expanding
Grafana's macros the way Grafana does), and every metric name against what is really exported."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "flightrec.json"
VLLM_PAGES = sorted((ROOT / "tests" / "fixtures" / "vllm-metrics").glob("*.txt"))
PROMTOOL = shutil.which("promtool")

PG_PLUGINS = {"grafana-postgresql-datasource", "postgres"}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def targets(dash: dict[str, Any], plugin: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """(label, target) for every query whose datasource is of one of these plugin types,
    annotation queries included."""
    out = []
    for panel in all_panels(dash):
        for t in panel.get("targets", []):
            ds = t.get("datasource") or panel.get("datasource") or {}
            if ds.get("type") in plugin:
                out.append((f"panel {panel['id']} {panel['title']!r} {t['refId']}", t))
    for anno in dash["annotations"]["list"]:
        ds = anno.get("datasource") or {}
        if ds.get("type") in plugin and "target" in anno:
            out.append((f"annotation {anno['name']!r}", anno["target"]))
    return out


def prom_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(label, t["expr"]) for label, t in targets(dash, {"prometheus"})]


def sql_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(label, t["rawSql"]) for label, t in targets(dash, PG_PLUGINS)]


# -- structure -------------------------------------------------------------------------------
def test_every_sql_panel_says_it_needs_postgres_and_where_else_to_look() -> None:
    # with SQLite (one node's default) Grafana has no datasource for them: they stay empty and
    # must say why, not look like "no faults"
    sql_panels = {label.split(" '")[1].split("'")[0] for label, _ in sql_queries(load()) if label.startswith("panel")}
    assert len(sql_panels) >= 5
    for panel in all_panels(load()):
        if panel.get("title") in sql_panels:
            text = panel.get("description") or ""
            assert "Postgres" in text and "SQLite" in text, panel["title"]


def test_provisionable_no_import_placeholders() -> None:
    text = DASHBOARD.read_text()
    dash = json.loads(text)
    assert "__inputs" not in dash and "__requires" not in dash
    assert "${DS_" not in text and "$DS_" not in text
    assert dash.get("id") is None  # a provisioned file carries no fixed id: Grafana assigns one
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"])


def test_uid_unique_among_shipped_dashboards() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in sorted((ROOT / "dashboards").glob("*.json"))]
    assert len(uids) == len(set(uids))


def test_panel_ids_unique_and_grid_in_bounds() -> None:
    panels = list(all_panels(load()))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
    # no two panels overlap
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_datasources_come_from_variables() -> None:
    dash = load()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["postgres"]["type"] == "datasource" and variables["postgres"]["query"] in PG_PLUGINS
    assert variables["public_url"]["type"] == "textbox"
    for panel in all_panels(dash):
        if panel["type"] in ("row", "text"):
            continue
        refs = [panel["datasource"], *(t.get("datasource", panel["datasource"]) for t in panel["targets"])]
        for ref in refs:
            assert ref["uid"] in ("${datasource}", "${postgres}"), panel["title"]
            want = "prometheus" if ref["uid"] == "${datasource}" else variables["postgres"]["query"]
            assert ref["type"] == want, panel["title"]


def test_every_variable_used_is_defined() -> None:
    dash = load()
    defined = {v["name"] for v in dash["templating"]["list"]}
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", DASHBOARD.read_text()))
    builtin = {n for n in used if n.startswith("__")}
    assert used - builtin - defined == set()
    assert builtin <= {"__rate_interval", "__interval", "__interval_ms", "__range", "__data", "__unixEpochFilter", "__unixEpochGroup", "__timeFilter"}


def test_snapshot_table_links_to_the_snapshot_page() -> None:
    dash = load()
    tables = [p for p in all_panels(dash) if p["type"] == "table" and "FROM snapshots" in json.dumps(p["targets"])]
    assert tables
    for p in tables:
        links = [
            link["url"]
            for o in p["fieldConfig"]["overrides"]
            if o["matcher"]["options"] == "id"
            for prop in o["properties"]
            if prop["id"] == "links"
            for link in prop["value"]
        ]
        assert links == ["${public_url}/snapshots/${__data.fields.id}"]


def test_panels_the_product_promises_are_there() -> None:
    exprs = " ".join(e for _, e in prom_exprs(load()))
    sqls = " ".join(q for _, q in sql_queries(load()))
    for needle in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "flightrec_engine_running_requests",
        "vllm:kv_cache_usage_perc",
        "rate(vllm:num_preemptions_total",
        "rate(vllm:generation_tokens_total",
        "vllm:inter_token_latency_seconds_bucket",
        "flightrec_gpu_temperature_celsius",
        "flightrec_gpu_power_watts",
        "flightrec_gpu_utilization_ratio",
        "flightrec_gpu_memory_used_bytes",
        "increase(flightrec_xid_events_total",
        "flightrec_snapshots_total",
        "flightrec_source_up",
    ):
        assert needle in exprs, needle
    for table in ("FROM snapshots", "FROM events", "FROM engine_step_seconds", "FROM incidents"):
        assert table in sqls, table
    # names vLLM V1 no longer exports, which silently draw nothing
    assert not re.search(r"vllm:num_preemptions(?!_total)", exprs)
    assert "vllm:gpu_prefix_cache" not in exprs and "vllm:gpu_cache_usage_perc" not in exprs


# -- PromQL through promtool -----------------------------------------------------------------
PROM_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "3h", "engine": "decode-0|prefill-0", "instance": ".*", "gpu": ".*"}


def expand_prom(expr: str) -> str:
    out = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: PROM_VARS[m.group(1)], expr)
    assert "$" not in out, out
    return out


@pytest.mark.promtool
@pytest.mark.skipif(PROMTOOL is None, reason="no promtool binary")
def test_every_promql_expression_parses(tmp_path: Path) -> None:
    exprs = prom_exprs(load())
    assert len(exprs) >= 20
    rules = [{"record": f"dashboard:expr_{i}", "expr": expand_prom(e)} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.promtool
@pytest.mark.skipif(PROMTOOL is None, reason="no promtool binary")
def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    # the check above is only worth something if promtool really parses each expression
    path = tmp_path / "broken.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "x",
                        "rules": [{"record": "x:y", "expr": expand_prom("sum by (engine (rate(vllm:num_preemptions_total[$__rate_interval]))")}],
                    }
                ]
            }
        )
    )
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


# -- metric names exist ----------------------------------------------------------------------
METRIC = re.compile(r"\b((?:vllm:|flightrec_)[A-Za-z0-9_:]+)")
LABEL_LISTS = re.compile(r"\{[^}]*\}|\b(?:by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """Metric names of one expression (label matchers and label lists dropped first, so a
    label such as flightrec_engine is not taken for a metric)."""
    return set(METRIC.findall(LABEL_LISTS.sub(" ", expr)))


# P/D connector families a CPU vLLM never exports, so the captured pages lack them; names and
# labels as vLLM registers them (v1/metrics/loggers.py:573 kv_fetch_by_stage with `stage`;
# kv_connector/v1/hisparse/stats.py:103-141 counters and gauges; kv_connector/v1/nixl/stats.py:
# 188 histogram, 244 counter). prometheus_client adds _total to counters, _bucket to histograms.
CONNECTOR_FAMILIES = {
    "vllm:num_requests_kv_fetch_by_stage",
    "vllm:hisparse_cache_hits_total",
    "vllm:hisparse_cache_misses_total",
    "vllm:hisparse_host_to_device_bytes_total",
    "vllm:hisparse_host_cache_usage_perc",
    "vllm:hisparse_pending_page_transfers",
    "vllm:nixl_xfer_time_seconds_bucket",
    "vllm:nixl_num_failed_transfers_total",
}
CONNECTOR_LABELS = {"stage"}


def vllm_names() -> set[str]:
    names = set(CONNECTOR_FAMILIES)
    for page in VLLM_PAGES:
        for line in page.read_text().splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def sidecar_names(tmp_path: Path) -> set[str]:
    """Sample names of the sidecar's real /metrics: its collector over the service's own
    ``AppContext`` (a real hub, writer, committer and detector task, none running) fed one engine
    step, one GPU sample and one Xid, with a committed snapshot and a source status."""
    import asyncio

    from prometheus_client import CollectorRegistry, generate_latest

    from collector.alerting.router import Alerter
    from collector.api.metrics import SidecarCollector
    from collector.context import AppContext
    from collector.detectors.task import DetectorTask
    from collector.model import (
        HALF_STATS,
        Event,
        EventKind,
        GpuSample,
        MetricsScrape,
        Severity,
        SourceStatus,
        StepRecord,
    )
    from collector.settings import EngineConfig, Settings
    from collector.storage.connect import make_engine
    from collector.storage.repo import Repository
    from collector.storage.writer import BatchWriter

    url = f"sqlite:///{tmp_path / 'm.db'}"
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://d", gpus=[0])], ring_steps=64, database=url, host_name="node-a")
    repo = Repository(make_engine(url), host="node-a")
    writer = BatchWriter(repo, interval=0.5)
    from tests.request_columns import Row, with_rows
    from tests.wiring import with_committer

    hub, committer = with_committer(settings, repo, rows=writer, clock=lambda: 1000.0, spool_dir=tmp_path / "spool", settle_s=0.2, window_s=30.0)
    alerter = Alerter(settings, host="node-a", snapshots_for=committer.snapshots_for, engine_up=lambda name: True, port=lambda: 8080)
    loop = asyncio.new_event_loop()
    try:
        ctx = AppContext(
            settings=settings,
            hub=hub,
            repo=repo,
            writer=writer,
            committer=committer,
            detectors=DetectorTask(hub.view, hub.emit, settings.detectors),
            loop=loop,
            alerter=alerter,
            unsupported=[SourceStatus(name="kmsg", up=True)],
            snapshot_counts={("decode-0", "cuda_error"): 1},
        )
        hub.emit(
            GpuSample(
                gpu="GPU-a",
                index=0,
                ts=999.0,
                bus_id="0000:00:05.0",
                memory_used=1,
                temperature=40.0,
                power_w=100.0,
                utilization=50.0,
                clock_event_reasons=0,
                ecc_volatile_uncorrected=0,
                remapped_rows_correctable=0,
                remapped_rows_uncorrectable=0,
            )
        )
        hub.emit(
            with_rows(
                StepRecord(engine="decode-0", ts=999.5, step=1, running=1, waiting=0, kv_cache_usage=0.1, halves=HALF_STATS),
                [Row(request_id="r", prompt_len=10, computed_tokens=10, mirror_rows=3)],
            )
        )
        rates = {"generation_tokens_total": 10.0, "prompt_tokens_total": 5.0, "num_preemptions_total": 0.0}
        rates |= {"time_to_first_token_seconds_sum": 0.5, "time_to_first_token_seconds_count": 2.0}
        rates |= {"inter_token_latency_seconds_sum": 0.1, "inter_token_latency_seconds_count": 10.0}
        hub.emit(MetricsScrape(engine="decode-0", ts=999.7, values={"num_requests_running": 1.0}, rates=rates))
        hub.emit(Event(kind=EventKind.XID, ts=1000.0, source="kmsg", message="Xid 31", xid=31, gpu="0000:00:05.0", severity=Severity.CRITICAL))
        assert committer.backlog == 1  # the Xid was decided a snapshot of decode-0
        registry = CollectorRegistry()
        registry.register(SidecarCollector(ctx))
        text = generate_latest(registry).decode()
    finally:
        loop.close()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_metric_name_is_really_exported(tmp_path: Path) -> None:
    exported = vllm_names() | sidecar_names(tmp_path)
    # the step's figures and the sidecar's own health reach /metrics
    assert {
        "flightrec_engine_running_requests",
        "flightrec_engine_mirror_rows",
        "flightrec_snapshots_waiting",
        "flightrec_source_up",
        "flightrec_alerts_total",
        "flightrec_snapshots_total",
    } <= exported
    assert "vllm:num_requests_running" in exported and "flightrec_xid_events_total" in exported
    used = {m for _, e in prom_exprs(load()) for m in metric_names(e)}
    used |= {m for v in load()["templating"]["list"] if v["type"] == "query" for m in metric_names(v["definition"])}
    assert len(used) >= 20
    missing = sorted(used - exported)
    assert missing == [], f"the dashboard queries names nobody exports: {missing}"


def test_label_names_the_panels_group_by_are_exported() -> None:
    """`by (...)` labels of vLLM series exist on vLLM's pages (flightrec_engine is added by the
    scrape config, deploy/prometheus/prometheus.yml)."""
    pages = "\n".join(p.read_text() for p in VLLM_PAGES)
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    added = {k for job in scrape["scrape_configs"] for sc in job.get("static_configs", []) for k in sc.get("labels", {})}
    for _, expr in prom_exprs(load()):
        if "vllm:" not in expr:
            continue
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (s.strip() for s in group.split(",")):
                assert label in added | CONNECTOR_LABELS or label == "le" or f'{label}="' in pages, (label, expr)


# -- SQL against the real Postgres -----------------------------------------------------------
T_FROM, T_TO = 1_700_000_000, 1_700_003_600
SQL_VARS = {"engine": "'decode-0','prefill-0'", "__interval": "20s", "__interval_ms": "20000"}


def _seconds(interval: str) -> int:
    value, unit = re.fullmatch(r"'?(\d+)(ms|s|m|h|d)'?", interval.strip()).groups()  # type: ignore[union-attr]
    return {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit] * int(value)


def _iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _macro_calls(q: str, name: str) -> Iterator[tuple[int, int, list[str]]]:
    """(start, end, arguments) of each ``$name(...)`` in q; arguments split on top-level commas,
    so ``$__timeFilter(to_timestamp(ts))`` has the one argument ``to_timestamp(ts)``."""
    start = q.find(f"${name}(")
    while start != -1:
        i = start + len(name) + 2
        depth, args, cur = 1, [], ""
        while depth:
            ch = q[i]
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 1 and ch == ",":
                args.append(cur.strip())
                cur = ""
            elif depth:
                cur += ch
            i += 1
        yield start, i, [*args, cur.strip()] if cur.strip() or args else []
        start = q.find(f"${name}(", i)


def _expand(q: str, name: str, render: Any) -> str:
    for start, end, args in reversed(list(_macro_calls(q, name))):
        q = q[:start] + render(*args) + q[end:]
    return q


def expand_sql(query: str, *, t_from: int = T_FROM, t_to: int = T_TO) -> str:
    """Grafana's Postgres macro engine, for the macros this dashboard uses: variables first,
    then macros (Grafana interpolates $__interval before it expands $__unixEpochGroup)."""
    q = re.sub(r"\$\{?(engine|__interval_ms|__interval)\b\}?", lambda m: SQL_VARS[m.group(1)], query)
    q = _expand(q, "__unixEpochFilter", lambda col: f"{col} >= {t_from} AND {col} <= {t_to}")
    q = _expand(q, "__timeFilter", lambda col: f"{col} BETWEEN '{_iso(t_from)}' AND '{_iso(t_to)}'")
    q = _expand(q, "__timeFrom", lambda: f"'{_iso(t_from)}'")
    q = _expand(q, "__timeTo", lambda: f"'{_iso(t_to)}'")
    q = _expand(q, "__unixEpochFrom", lambda: str(t_from))
    q = _expand(q, "__unixEpochTo", lambda: str(t_to))
    q = _expand(q, "__unixEpochGroupAlias", lambda col, iv, *_: f'floor({col}/{_seconds(iv)})*{_seconds(iv)} AS "time"')
    q = _expand(q, "__unixEpochGroup", lambda col, iv, *_: f"floor({col}/{_seconds(iv)})*{_seconds(iv)}")
    assert "$" not in q, f"a macro or variable the test does not expand: {q}"
    return q


def test_expand_sql_follows_grafana() -> None:
    cases = [
        ("WHERE $__unixEpochFilter(s.ts)", f"WHERE s.ts >= {T_FROM} AND s.ts <= {T_TO}"),
        ("WHERE $__timeFilter(to_timestamp(ts))", "WHERE to_timestamp(ts) BETWEEN '2023-11-14T22:13:20Z' AND '2023-11-14T23:13:20Z'"),
        ("SELECT $__unixEpochGroup(ts, $__interval)", "SELECT floor(ts/20)*20"),
        ("SELECT $__unixEpochGroupAlias(ts, '5m')", 'SELECT floor(ts/300)*300 AS "time"'),
        ("e.name IN ($engine)", "e.name IN ('decode-0','prefill-0')"),
        ("x / ($__interval_ms / 1000.0)", "x / (20000 / 1000.0)"),
    ]
    for query, want in cases:
        assert expand_sql(query) == want


def _fill(url: str) -> None:
    """A little of everything, inside the dashboard's time range, the way the sidecar writes it."""
    from sqlalchemy import create_engine, insert

    from collector.columns import batch_from_rows
    from collector.storage.models import (
        EngineRow,
        EngineStepSecondRow,
        EventRow,
        GpuRow,
        GpuSampleRow,
        IncidentRow,
        SnapshotRow,
    )
    from collector.storage.steps import SECOND_FIGURES, second_rows

    t0 = T_FROM + 600.0
    engine = create_engine(url)
    with engine.begin() as conn:
        ids = {}
        for name in ("prefill-0", "decode-0"):
            ids[name] = conn.execute(
                insert(EngineRow).values(host="node-a", name=name, first_seen=t0, last_seen=t0).returning(EngineRow.id)
            ).scalar_one()
        for name in ids:
            steps = [
                dict(
                    ts=t0 + i * 0.25,
                    step=i,
                    run=0,
                    running=i % 16,
                    waiting=i % 3,
                    kv_cache_usage=0.03,
                    preemptions=int(i % 7 == 0),
                    prompt_tokens=64,
                    generation_tokens=16,
                    mirror_rows=400 + i if name == "decode-0" else None,
                )
                for i in range(400)
            ]
            seconds = second_rows(ids[name], batch_from_rows(name, steps).cols)  # what the writer stores beside the chunks
            conn.execute(insert(EngineStepSecondRow), [dict(zip(("engine_id", "ts", "steps", *SECOND_FIGURES), r, strict=True)) for r in seconds])
        gpu = conn.execute(insert(GpuRow).values(host="node-a", gpu="GPU-a", index=0, first_seen=t0, last_seen=t0).returning(GpuRow.id)).scalar_one()
        conn.execute(insert(GpuSampleRow), [dict(gpu_id=gpu, ts=t0 + i, temperature=40.0 + i % 5, power_w=300.0) for i in range(100)])
        inc = conn.execute(
            insert(IncidentRow)
            .values(
                key="k",
                title="decode-0 CUDA error",
                opened_at=t0 + 100,
                updated_at=t0 + 101,
                trigger_kind="cuda_error",
                hosts=["node-a"],
                engines=["decode-0"],
                snapshot_count=1,
            )
            .returning(IncidentRow.id)
        ).scalar_one()
        snap = conn.execute(
            insert(SnapshotRow)
            .values(
                incident_id=inc,
                host="node-a",
                engine="decode-0",
                created_at=t0 + 100,
                fault_ts=t0 + 99.5,
                trigger_kind="cuda_error",
                trigger_source="log",
                trigger_message="CUDA error: unspecified launch failure",
                step_count=400,
                request_rows=5000,
                first_step=0,
                last_step=399,
                summary={},
                fingerprint={},
            )
            .returning(SnapshotRow.id)
        ).scalar_one()
        conn.execute(
            insert(EventRow),
            [
                dict(
                    ts=t0 + 99.5,
                    host="node-a",
                    kind="cuda_error",
                    source="log",
                    severity="critical",
                    engine="decode-0",
                    gpu=None,
                    xid=None,
                    message="CUDA error",
                    data={},
                    snapshot_id=snap,
                ),
                dict(
                    ts=t0 + 99.4,
                    host="node-a",
                    kind="xid",
                    source="kmsg",
                    severity="critical",
                    engine=None,
                    gpu="0000:00:05.0",
                    xid=31,
                    message="Xid 31",
                    data={},
                    snapshot_id=None,
                ),
            ],
        )
    engine.dispose()


@pytest.fixture
def filled_pg(pg_url: str) -> str:
    from collector.storage.migrate import upgrade

    upgrade(pg_url)
    _fill(pg_url)
    return pg_url


@pytest.mark.postgres
def test_every_sql_query_runs_on_postgres_and_returns_rows(filled_pg: str) -> None:
    from sqlalchemy import create_engine, text

    queries = sql_queries(load())
    assert len(queries) >= 8
    engine = create_engine(filled_pg)
    try:
        with engine.connect() as conn:
            for label, query in queries:
                result = conn.execute(text(expand_sql(query)))
                rows = result.fetchall()
                assert rows, f"{label} returned no row"
                cols = list(result.keys())
                if '"time"' in query or "AS time" in query:
                    assert "time" in cols, label
                    assert all(r[cols.index("time")] is not None for r in rows), label
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_sql_queries_respect_the_time_range(filled_pg: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(filled_pg)
    try:
        with engine.connect() as conn:
            for label, query in sql_queries(load()):
                before = expand_sql(query, t_from=T_FROM - 7200, t_to=T_FROM - 3600)
                assert conn.execute(text(before)).fetchall() == [], label
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_per_step_tokens_per_second_matches_the_stored_steps(filled_pg: str) -> None:
    """4 steps/s x 16 generation tokens = 64 tokens/s in every full 20 s bucket."""
    from sqlalchemy import create_engine, text

    [(_, query)] = [(lbl, q) for lbl, q in sql_queries(load()) if "generation_tokens_per_s" in q]
    engine = create_engine(filled_pg)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(expand_sql(query))).mappings().all()
    finally:
        engine.dispose()
    full = [r for r in rows if r["engine"] == "decode-0"][1:-1]  # first and last buckets are partial
    assert full and {round(float(r["generation_tokens_per_s"]), 6) for r in full} == {64.0}
