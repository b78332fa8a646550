"""The snapshot page's server-rendered parts: what the on-call engineer reads first, in the
first response, before any script has run or any plot is drawn.

One function per section, listed in ``SECTIONS`` in page order; each takes the page's facts
(the snapshot's header row, no parts: one indexed read) and returns one ``<section>`` of HTML.
A part added to the page later is one more function and one more line there. Every value from
the snapshot is escaped (``html.escape``): a log line that looks like markup stays text.

- ``summary``: the fault, its GPU, the engine, model, TP size, P/D role and pair, vLLM version;
- ``next_steps``: the runbook for the Xid or the error class (with the Xid catalog's meaning and
  action), and the ``flightrec report`` and ``flightrec replay`` commands for this snapshot.

The plots and tables below them come from the JSON API, drawn by ``snapshot.js``.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collector.snapshot.document import SnapshotDoc
from collector.xid.catalog import lookup as xid_lookup

# the runbook (docs/alerting.md, one section per alertname) of each trigger kind
RUNBOOKS = {
    "xid": "GpuXidError",
    "gpu_lost": "GpuLost",
    "cuda_error": "VllmEngineCrashed",
    "engine_fatal": "VllmEngineCrashed",
    "engine_dead": "VllmEngineCrashed",
    "recorder_silent": "VllmEngineCrashed",
    "nccl_error": "VllmNcclError",
    "engine_down": "VllmEngineDown",
    "engine_wedged": "VllmEngineWedged",
}
ROLES = {"kv_consumer": "decode (kv_consumer)", "kv_producer": "prefill (kv_producer)", "kv_both": "prefill and decode (kv_both)"}
UNKNOWN = '<span class="missing">not recorded</span>'


@dataclass(frozen=True)
class PageFacts:
    doc: SnapshotDoc  # the header: trigger, summary, fingerprint (no parts)
    runbook_base: str = ""  # alerting.runbook_base: where the runbooks are published
    database: str = ""  # the sidecar's database URL as a command line may give it (redacted)
    engine_url: str | None = None  # the engine's URL, a replay's target


Section = Callable[[PageFacts], str]


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _value(value: Any) -> str:
    return UNKNOWN if value in (None, "") else _e(value)


def fault_gpu(doc: SnapshotDoc) -> str | None:
    trig = doc.trigger or {}
    if trig.get("gpu"):
        return str(trig["gpu"])
    return None


def summary(f: PageFacts) -> str:
    doc, fp = f.doc, f.doc.fingerprint or {}
    trig = doc.trigger or {}
    kind = str(trig.get("kind") or "?")
    message = str(trig.get("message") or "").strip().splitlines()
    fault = f'<span class="fault-kind">{_e(kind)}</span> {_e(message[0][:300]) if message else ""}'
    xids = (doc.summary or {}).get("xids") or ([trig["xid"]] if trig.get("xid") is not None else [])
    gpu = fault_gpu(doc)
    gpu_text = (_e(gpu) if gpu else "") + (f" (Xid {', '.join(_e(x) for x in xids)})" if xids else "")
    role = fp.get("kv_role")
    rows = [
        ("fault", fault),
        ("GPU", gpu_text or UNKNOWN),
        ("engine", f"{_e(doc.engine)} on {_e(doc.host)}"),
        ("model", _value(fp.get("model") or fp.get("served_model_name"))),
        ("TP size", _value(fp.get("tensor_parallel_size"))),
        ("P/D role", _value(ROLES.get(str(role), role) if role else None)),
        ("pair", _value((doc.summary or {}).get("pair") or fp.get("pair"))),
        ("vLLM version", _value(fp.get("vllm_version"))),
    ]
    cells = "".join(f'<div class="fact" data-key="{_e(k)}"><dt>{_e(k)}</dt><dd>{v}</dd></div>' for k, v in rows)
    return f'<section id="summary" class="card"><dl class="facts-grid">{cells}</dl></section>'


def next_steps(f: PageFacts) -> str:
    doc = f.doc
    trig = doc.trigger or {}
    kind = str(trig.get("kind") or "")
    items = []
    alert = RUNBOOKS.get(kind)
    if kind == "anomaly":
        alert = None
    if alert:
        anchor = alert.lower()
        if f.runbook_base:
            link = f'<a id="runbook" href="{_e(f.runbook_base.rstrip("/") + "#" + anchor)}">runbook: {_e(alert)}</a>'
        else:
            link = (
                f'<span id="runbook">runbook: <b>{_e(alert)}</b> in docs/alerting.md '
                '<span class="muted">(set alerting.runbook_base to link your published runbooks)</span></span>'
            )
        items.append(f"<li>{link}</li>")
    if trig.get("xid") is not None:
        info = xid_lookup(int(trig["xid"]))
        items.append(
            f'<li id="xid-action">Xid {_e(info.code)} · {_e(info.name)} ({_e(info.severity.value)}, {_e(info.category)}): '
            f"{_e(info.meaning)} <b>Action:</b> {_e(info.action)}</li>"
        )
    db = f" --db {shlex.quote(f.database)}" if f.database else ""
    sid = doc.id
    target = shlex.quote(f.engine_url) if f.engine_url else "http://ENGINE:8000"
    commands = [
        (f"flightrec report {sid}{db} --bundle", "the bug report to file upstream, and the redacted bundle to attach"),
        (f"flightrec replay --plan {sid}{db}", "the load recorded before the fault, as phases"),
        (f"flightrec replay {sid}{db} --target {target}", "drive an engine with that load, to reproduce the fault"),
    ]
    cmd_html = "".join(f'<li><code class="cmd">{_e(c)}</code> <span class="muted">{_e(why)}</span></li>' for c, why in commands)
    return (
        '<section id="next-steps" class="card"><h2>Next steps</h2>'
        f'<ul class="next">{"".join(items)}</ul><ul class="commands">{cmd_html}</ul></section>'
    )


# The page's server-rendered sections, in order. One line per part.
SECTIONS: tuple[Section, ...] = (summary, next_steps)


def render(facts: PageFacts, sections: tuple[Section, ...] = SECTIONS) -> str:
    return "\n".join(section(facts) for section in sections)
