"""A snapshot as a vLLM bug report: Markdown in the shape of vLLM's issue template ("Your current
environment", "Describe the bug"), with what a maintainer asks for first: the environment from
the engine's fingerprint, the exact engine arguments, the connector configuration, the fault
with every traceback and the Xid's catalog meaning, the last steps summarised, and the replay
plan as the recipe to reproduce the load.

Pure: ``render(export)`` reads one snapshot export (``flightrec.snapshot/v1``, already
scrubbed when it leaves the site) and returns text. Unknown stays unknown: a value the
snapshot does not hold is written "not recorded", never guessed.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from collector import __version__
from collector.stacks.paths import short_path
from collector.xid.catalog import lookup

NOT_RECORDED = "not recorded"
# Fingerprint keys shown elsewhere (environment, connectors) or that identify the process only.
_NOT_ARGS = frozenset(
    {
        "env",
        "kv_transfer_config",
        "connectors",
        "hostname",
        "pid",
        "server_pid",
        "server_host",
        "server_port",
        "name_from",
        "engine_index",
        "hisparse",
        "nixl",
    }
)
_LOUD = ("xid", "cuda_error", "nccl_error", "engine_fatal", "engine_dead", "gpu_lost", "crash_dump")
LAST_STEPS_SHOWN = 12


def render(snap: Mapping[str, Any], *, plan_text: str | None = None, note: str | None = None) -> str:
    fp: Mapping[str, Any] = snap.get("fingerprint") or {}
    parts = [
        f"# {title(snap)}",
        "",
        note
        or f"_Written by `flightrec report` (vLLM Flight Recorder {__version__}) from crash snapshot {snap.get('id')}: "
        "request ids are hashed, prompt content was never recorded, secrets are masked._",
        "",
        "### Your current environment",
        "",
        "<details>",
        "<summary>The engine's environment, from the flight recorder's fingerprint of it (in place of <code>python collect_env.py</code>)</summary>",
        "",
        "```text",
        *_environment(snap, fp),
        "```",
        "",
        "</details>",
        "",
        "### 🐛 Describe the bug",
        "",
        _what_happened(snap),
        "",
        "#### Engine arguments",
        "",
        *_engine_args(snap, fp),
        "",
        "#### KV connector configuration",
        "",
        *_connectors(snap, fp),
        "",
        "#### The fault",
        "",
        *_fault(snap),
        "",
        *_stacks(snap),
        "#### The last steps before the fault",
        "",
        *_last_steps(snap),
        "",
        "#### How to reproduce",
        "",
        *_reproduce(snap, plan_text),
        "",
        "#### Timeline",
        "",
        *_timeline(snap),
        "",
        "### Before submitting a new issue...",
        "",
        "- [ ] Make sure you already searched for relevant issues, and asked the chatbot living at the bottom right corner of the "
        "[documentation page](https://docs.vllm.ai/en/latest/), which can answer lots of frequently asked questions.",
        "",
    ]
    return "\n".join(parts)


def title(snap: Mapping[str, Any]) -> str:
    fp = snap.get("fingerprint") or {}
    trig = snap.get("trigger") or {}
    kind = trig.get("kind") or "fault"
    what = _exception_of(snap) or trig.get("message") or kind
    conns = "+".join(c for c in (fp.get("connectors") or []) if c != "MultiConnector")
    side = {"kv_consumer": "P/D decode", "kv_producer": "P/D prefill"}.get(str(fp.get("kv_role")), "")
    where = ", ".join(x for x in (f"vLLM {fp['vllm_version']}" if fp.get("vllm_version") else "", conns, side) if x)
    xid = _xid(snap)
    if xid is not None and what != trig.get("message"):  # the Xid and the workers' error, both
        head = f"Xid {xid} ({lookup(xid).name}) with {what}"
    else:
        head = what
    return f"[Bug]: {head}" + (f" ({where})" if where else "")


def _exception_of(snap: Mapping[str, Any]) -> str | None:
    """The workers' exception: the first line of what a failed worker raised."""
    for e in snap.get("events") or []:
        if e.get("kind") == "cuda_error" or e.get("kind") == "nccl_error":
            exc = (e.get("data") or {}).get("exceptions") or []
            if exc:
                return str(exc[0])
            return str(e.get("message") or "") or None
    return None


def _xid(snap: Mapping[str, Any]) -> int | None:
    xids = (snap.get("summary") or {}).get("xids") or [e.get("xid") for e in snap.get("events") or [] if e.get("xid") is not None]
    return int(xids[0]) if xids else None


def _role(fp: Mapping[str, Any]) -> str:
    role = fp.get("kv_role")
    return {"kv_consumer": "decode (kv_consumer)", "kv_producer": "prefill (kv_producer)"}.get(str(role), str(role)) if role else ""


def _v(value: Any) -> str:
    if value is None:
        return NOT_RECORDED
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return NOT_RECORDED
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d} UTC"


def _environment(snap: Mapping[str, Any], fp: Mapping[str, Any]) -> list[str]:
    gpus: dict[str, Any] = {}
    totals: dict[str, list[Any]] = {}
    for g in snap.get("gpu_samples") or []:
        gpus.setdefault(str(g.get("gpu")), g)
        if g.get("memory_total"):
            totals.setdefault(str(g.get("gpu")), []).append(g["memory_total"])
    gpu_lines = [
        f"  GPU {g.get('index')}: {g.get('name') or NOT_RECORDED}, bus {g.get('bus_id') or '?'}, {_memory(totals.get(key, []))} memory"
        for key, g in sorted(gpus.items(), key=lambda kv: kv[1].get("index") or 0)
    ]
    rows = [
        ("vLLM version", fp.get("vllm_version")),
        ("Model", fp.get("model")),
        ("Device", fp.get("device")),
        ("dtype / KV cache dtype", f"{_v(fp.get('dtype'))} / {_v(fp.get('kv_cache_dtype'))}"),
        ("Parallelism", f"TP {_v(fp.get('tensor_parallel_size'))}, PP {_v(fp.get('pipeline_parallel_size'))}, DP {_v(fp.get('data_parallel_size'))}"),
        ("Host", snap.get("host")),
        ("Engine", f"{snap.get('engine')}, {_role(fp) or 'no KV role'}"),
        ("Driver, CUDA, PyTorch", "not recorded by the flight recorder: run `python collect_env.py` on the node"),
    ]
    out = [f"{k:24}: {_v(v)}" for k, v in rows]
    out.append(f"{'GPUs (NVML samples)':24}:" + ("" if gpu_lines else f" {NOT_RECORDED}"))
    out += gpu_lines
    env = fp.get("env")
    out.append(f"{'Environment variables':24}:" + ("" if isinstance(env, dict) and env else f" {NOT_RECORDED}"))
    if isinstance(env, dict):
        out += [f"  {k}={v}" for k, v in sorted(env.items())]
    return out


def _memory(totals: list[Any]) -> str:
    """A GPU's memory as most of its samples give it, not as one sample does (and says so when
    the samples disagree)."""
    if not totals:
        return _gib(None)
    values = Counter(totals)
    common = values.most_common(1)[0][0]
    if len(values) == 1:
        return _gib(common)
    others = ", ".join(_gib(v) for v in sorted(values) if v != common)
    return f"{_gib(common)} ({len(totals) - values[common]} of {len(totals)} samples said otherwise: {others})"


def _gib(n: Any) -> str:
    return f"{n / 2**30:.0f} GiB" if isinstance(n, (int, float)) and n else "? GiB"


def _what_happened(snap: Mapping[str, Any]) -> str:
    s = snap.get("summary") or {}
    fp = snap.get("fingerprint") or {}
    trig = snap.get("trigger") or {}
    reqs = s.get("requests_at_last_step") or {}
    failed = s.get("failed_processes") or {}
    steps = [int(f["step"]) for f in failed.values() if isinstance(f, dict) and isinstance(f.get("step"), int)]
    peers = snap.get("peers") or []
    pair = ""
    if peers:
        pair = (
            " Its P/D peer"
            + ("s" if len(peers) > 1 else "")
            + ": "
            + ", ".join(f"{p.get('engine')}, {_role(p.get('fingerprint') or {}) or '?'}" for p in peers)
            + "."
        )
    load = ""
    if reqs:
        load = (
            f" At the last recorded step {reqs.get('step')} it was running {reqs.get('count')} requests with contexts of "
            f"{reqs.get('context_len_min')}–{reqs.get('context_len_max')} tokens"
            + (f", kv_cache_usage {s.get('kv_cache_usage')}" if s.get("kv_cache_usage") is not None else "")
            + "."
        )
    died = f" in step {max(steps)}" if steps else ""
    return (
        f"The engine `{snap.get('engine')}`, {_role(fp) or 'no KV role'} serving `{fp.get('model') or NOT_RECORDED}`, failed{died} at "
        f'{_when(snap.get("fault_ts"))}: {trig.get("kind", "?")} from {trig.get("source", "?")}, "{trig.get("message", "")}".'
        f"{load}{pair} Failed processes: {', '.join(failed) or NOT_RECORDED}."
    )


def _engine_args(snap: Mapping[str, Any], fp: Mapping[str, Any]) -> list[str]:
    out = []
    non_default = [ln.get("line", "") for ln in snap.get("log_lines") or [] if "non-default args" in str(ln.get("line", ""))]
    if non_default:
        out += ["vLLM's own line at start (verbatim, secrets masked):", "", "```text", non_default[-1], "```", ""]
    args = {k: v for k, v in fp.items() if k not in _NOT_ARGS}
    if not args:
        return out + [f"The engine's configuration was {NOT_RECORDED} (no in-engine recorder ran for this engine)."]
    out += ["As the engine ran them (read from its `VllmConfig` by the in-engine recorder):", "", "| argument | value |", "| --- | --- |"]
    out += [f"| `{k}` | `{_v(v)}` |" for k, v in args.items()]
    return out


def _connectors(snap: Mapping[str, Any], fp: Mapping[str, Any]) -> list[str]:
    kv = fp.get("kv_transfer_config")
    if not kv:
        return [f"KV transfer config: {NOT_RECORDED} (or none configured)."]
    out = [f"Connectors in use: {', '.join(fp.get('connectors') or []) or NOT_RECORDED}.", ""]
    out += [f"`{snap.get('engine')}`, {_role(fp) or '?'}:", "", "```json", json.dumps(kv, indent=2, sort_keys=True, default=str), "```"]
    for p in snap.get("peers") or []:
        pkv = (p.get("fingerprint") or {}).get("kv_transfer_config")
        if pkv:
            out += [
                "",
                f"Peer `{p.get('engine')}`, {_role(p.get('fingerprint') or {}) or '?'}:",
                "",
                "```json",
                json.dumps(pkv, indent=2, sort_keys=True, default=str),
                "```",
            ]
    extra = {k: fp.get(k) for k in ("hisparse", "nixl", "host_pool_size", "offload_cpu_bytes") if fp.get(k) not in (None, {}, [])}
    if extra:
        out += ["", "Connector settings read from vLLM's config: " + ", ".join(f"`{k}` = `{_v(v)}`" for k, v in extra.items()) + "."]
    return out


def _fault(snap: Mapping[str, Any]) -> list[str]:
    s = snap.get("summary") or {}
    trig = snap.get("trigger") or {}
    out = [f"- Trigger: **{trig.get('kind', '?')}** from {trig.get('source', '?')} at {_when(snap.get('fault_ts'))}: {trig.get('message', '')}"]
    seen_xids = set()
    for e in snap.get("events") or []:
        if e.get("xid") is None or e.get("xid") in seen_xids:
            continue
        seen_xids.add(e.get("xid"))
        cat = (e.get("data") or {}).get("catalog") or lookup(int(e["xid"])).to_dict()
        out.append(
            f"- **Xid {cat.get('code', e.get('xid'))}: {cat.get('name')}** ({cat.get('severity')}, {cat.get('category')}): {cat.get('meaning')} "
            f"Action: {cat.get('action')}" + (" (not in the catalog)" if cat.get("known") is False else "")
        )
        out.append(f"  - kernel line: `{e.get('message', '')}`")
    failed = s.get("failed_processes") or {}
    if failed:
        out += ["", "| process | pid | step | error |", "| --- | --- | --- | --- |"]
        for proc, f in failed.items():
            out.append(f"| {proc} | {_v(f.get('pid'))} | {_v(f.get('step'))} | {str(f.get('message') or '').replace('|', '/')} |")
    # the failing workers' own tracebacks first, then the engine core's and the server's
    order = {"cuda_error": 0, "nccl_error": 0, "engine_fatal": 1, "engine_dead": 2}
    tracebacks = sorted(
        (e for e in snap.get("events") or [] if e.get("lines") and len(e["lines"]) > 1 and e.get("kind") != "crash_dump"),
        key=lambda e: order.get(str(e.get("kind")), 3),
    )
    if not tracebacks:
        out += ["", f"Tracebacks: {NOT_RECORDED} (no traceback in the engine log)."]
    for e in tracebacks:
        who = str(e.get("process") or e.get("engine") or "?") + (f" pid {e['pid']}" if e.get("pid") else "")
        out += [
            "",
            f"<details><summary>Traceback of {who} ({e.get('kind')}): {e.get('message', '')}</summary>",
            "",
            "```text",
            *[str(x) for x in e["lines"]],
            "```",
            "",
            "</details>",
        ]
    return out


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _last_steps(snap: Mapping[str, Any]) -> list[str]:
    steps = [r for r in snap.get("steps") or [] if isinstance(r, dict)]
    if not steps:
        return [f"Steps: {NOT_RECORDED} (no in-engine recorder data for this engine)."]
    fault = snap.get("fault_ts") or steps[-1].get("ts")
    durations = [
        b["ts"] - a["ts"]
        for a, b in zip(steps, steps[1:], strict=False)
        if isinstance(a.get("ts"), (int, float)) and isinstance(b.get("ts"), (int, float))
    ]
    tokens = [
        (r.get("prompt_tokens") or 0) + (r.get("generation_tokens") or 0)
        for r in steps
        if r.get("generation_tokens") is not None or r.get("prompt_tokens") is not None
    ]
    out = [
        f"{len(steps)} steps recorded, {steps[0].get('step')}–{steps[-1].get('step')}, "
        f"{_when(steps[0].get('ts'))} to {_when(steps[-1].get('ts'))} (the fault {fault - steps[-1]['ts']:+.3f} s after the last)."
        if isinstance(fault, (int, float)) and isinstance(steps[-1].get("ts"), (int, float))
        else f"{len(steps)} steps recorded.",
        "",
        "| figure | median | p99 | max | last 10 steps (mean) |",
        "| --- | --- | --- | --- | --- |",
    ]

    def row(name: str, values: Sequence[float], fmt: str) -> None:
        if not values:
            out.append(f"| {name} | {NOT_RECORDED} | | | |")
            return
        tail = values[-10:]
        out.append(
            f"| {name} | {fmt.format(statistics.median(values))} | {fmt.format(_pct(values, 0.99))} | {fmt.format(max(values))} | "
            f"{fmt.format(sum(tail) / len(tail))} |"
        )

    row("step duration (ms)", [d * 1000 for d in durations], "{:.2f}")
    row("tokens per step", tokens, "{:.0f}")
    row("scheduled prefill tokens", [r["prompt_tokens"] for r in steps if isinstance(r.get("prompt_tokens"), (int, float))], "{:.0f}")
    row("scheduled decode tokens", [r["generation_tokens"] for r in steps if isinstance(r.get("generation_tokens"), (int, float))], "{:.0f}")
    row("running", [r["running"] for r in steps if isinstance(r.get("running"), (int, float))], "{:.0f}")
    row("waiting", [r["waiting"] for r in steps if isinstance(r.get("waiting"), (int, float))], "{:.0f}")
    row("kv_cache_usage", [r["kv_cache_usage"] for r in steps if isinstance(r.get("kv_cache_usage"), (int, float))], "{:.3f}")
    s = snap.get("summary") or {}
    out += ["", f"Preemptions in the recorded steps: {_v(s.get('preemptions_in_ring'))}; peak running + waiting: {_v(s.get('peak_concurrency'))}."]
    ctx = _context_lengths(snap)
    if ctx:
        out.append(ctx)
    cols = ["step", "ts", "running", "waiting", "kv_cache_usage", "prompt_tokens", "generation_tokens", "preemptions", "mirror_rows"]
    out += [
        "",
        f"The last {min(LAST_STEPS_SHOWN, len(steps))} steps:",
        "",
        "| " + " | ".join(c if c != "ts" else "s from fault" for c in cols) + " |",
    ]
    out.append("| " + " | ".join("---" for _ in cols) + " |")
    for r in steps[-LAST_STEPS_SHOWN:]:
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "ts" and isinstance(v, (int, float)) and isinstance(fault, (int, float)):
                cells.append(f"{v - fault:+.3f}")
            else:
                cells.append(_v(v) if v is not None else "")
        out.append("| " + " | ".join(cells) + " |")
    return out


def _context_lengths(snap: Mapping[str, Any]) -> str | None:
    cols = (snap.get("requests") or {}).get("columns") or {}
    step, ctx = cols.get("step") or [], cols.get("computed_tokens") or []
    if not step or not ctx:
        return None
    last = step[-1]
    at_last = [c for s, c in zip(step, ctx, strict=False) if s == last and isinstance(c, (int, float))]
    if not at_last:
        return None
    return (
        f"Context length (computed tokens) of the {len(at_last)} requests at step {last}: min {min(at_last)}, p50 {_pct(at_last, 0.5)}, "
        f"p90 {_pct(at_last, 0.9)}, max {max(at_last)}."
    )


def _reproduce(snap: Mapping[str, Any], plan_text: str | None) -> list[str]:
    fp = snap.get("fingerprint") or {}
    out = [
        "1. Start vLLM with the engine arguments above"
        + (" (and its P/D peer with its own, the connector configuration above)" if snap.get("peers") else "")
        + f", model `{fp.get('model') or NOT_RECORDED}`.",
        "2. Send the load recorded before the fault, with `flightrec replay` (prompts are random tokens of the recorded lengths; "
        "the snapshot in the attached bundle carries the load):",
        "",
        "   ```sh",
        "   pip install <a checkout of vllm-flight-recorder>   # not on PyPI: from its source, or a wheel built from it",
        "   flightrec replay --plan --from-file snapshot.json          # the plan below",
        "   flightrec replay --from-file snapshot.json --target http://127.0.0.1:8000",
        "   ```",
        "",
        "3. The plan (phases by concurrency, as the original load ran them):",
        "",
    ]
    if plan_text:
        out += ["```text", plan_text, "```"]
    else:
        out.append(f"   The load before the fault was {NOT_RECORDED}: no replay plan.")
    replays = (snap.get("summary") or {}).get("replays") or []
    if replays:
        out += ["", "Replays already run:", ""]
        for r in replays:
            out.append(
                f"- {_when(r.get('ts'))}: speed {_v(r.get('speed'))}, "
                + (f"the engine died in phase {r.get('died_phase')} (C{r.get('died_concurrency')})" if r.get("died") else "the engine survived")
                + (f", snapshot {r.get('snapshot_id')}" if r.get("snapshot_id") else "")
            )
    return out


def _timeline(snap: Mapping[str, Any]) -> list[str]:
    events = sorted((e for e in snap.get("events") or [] if isinstance(e.get("ts"), (int, float))), key=lambda e: e["ts"])
    if not events:
        return [f"Events: {NOT_RECORDED}."]
    fault = snap.get("fault_ts") or events[0]["ts"]
    out = ["| s from fault | kind | source | process | message |", "| --- | --- | --- | --- | --- |"]
    for e in events:
        sources = ", ".join(e.get("sources") or [str(e.get("source"))])
        msg = str(e.get("message") or "").replace("|", "/").replace("\n", " ")[:200]
        approx = " (log, ±1 s)" if sources == "log" else ""
        out.append(f"| {e['ts'] - fault:+.3f}{approx} | {e.get('kind')} | {sources} | {e.get('process') or ''} | {msg} |")
    return out


STACK_FRAMES_SHOWN = 40  # frames of one thread in the report (innermost first); the export has them all


def _stacks(snap: Mapping[str, Any]) -> list[str]:
    """A wedge's stacks (the snapshot's ``stacks`` part): each process's blocking frame, the
    threads that did not move with their frames, the GPUs at the dumps, the NCCL/CUDA environment.
    Nothing for a snapshot without the part (a crash's)."""
    st = snap.get("stacks")
    if not isinstance(st, Mapping):
        return []
    tool = st.get("tool") or {}
    out = [
        "#### The engine's stacks while it was wedged",
        "",
        f"Read with py-spy {tool.get('version') or ''} (`dump --nonblocking`, the engine was not paused), twice, "
        f"{_v(st.get('interval_s'))} s apart: **{st.get('status')}**. Frames innermost first; `=` did not move between the dumps, "
        "`~` moved, `·` native.",
        "",
    ]
    out += [f"- {r}" for r in st.get("reasons") or []]
    out += [f"- _{n}_" for n in st.get("notes") or []]
    if st.get("reasons") or st.get("notes"):
        out.append("")
    procs = [p for p in st.get("processes") or [] if isinstance(p, Mapping)]
    if procs:
        out += ["| process | pid | state | blocked at | in |", "| --- | --- | --- | --- | --- |"]
        for p in procs:
            b = p.get("blocking") or {}
            out.append(
                f"| {p.get('role')} `{_cell(p.get('title'))}` | {p.get('pid')} | {p.get('state')} | "
                f"{_cell(_frame(b.get('frame')))} | {_cell(_frame(b.get('in')))} |"
            )
    for p in procs:
        threads = [t for t in p.get("threads") or [] if isinstance(t, Mapping)]
        shown = [t for t in threads if t.get("state") != "idle"]
        idle = [str(t.get("name") or t.get("tid")) for t in threads if t.get("state") == "idle"]
        if not shown and not idle:
            continue
        out += ["", f"<details><summary>{p.get('role')} {_cell(p.get('title'))} (pid {p.get('pid')}): {p.get('state')}</summary>", ""]
        for t in shown:
            frames = [f for f in t.get("frames") or [] if isinstance(f, Mapping)]
            out += [f"Thread {t.get('name') or ''} (tid {t.get('tid')}{', main' if t.get('main') else ''}): {t.get('state')}", "", "```text"]
            out += [_mark(f) + _frame(f) for f in frames[:STACK_FRAMES_SHOWN]]
            if len(frames) > STACK_FRAMES_SHOWN:
                out.append(f"  ... {len(frames) - STACK_FRAMES_SHOWN} more frames (the export holds them)")
            out += ["```", ""]
        if idle:
            out += [f"Idle threads (waiting for work in both dumps): {', '.join(idle)}.", ""]
        out.append("</details>")
    gpus = [g for g in st.get("gpus") or [] if isinstance(g, Mapping)]
    if gpus:
        out += [
            "",
            "GPUs at the dumps (NVML):",
            "",
            "| GPU | utilisation % per dump | memory used | processes | reading |",
            "| --- | --- | --- | --- | --- |",
        ]
        for g in gpus:
            readings = g.get("readings") or []
            last = next((r for r in reversed(readings) if isinstance(r, Mapping)), {})
            utils = " → ".join(_v(r.get("utilization")) if isinstance(r, Mapping) else "–" for r in readings)
            procs_on = ", ".join(f"{q.get('role') or '?'} {q.get('pid')}" for q in g.get("processes") or [] if isinstance(q, Mapping))
            out.append(f"| {g.get('index')} {g.get('name') or ''} | {utils} | {_gib(last.get('memory_used'))} | {procs_on} | {g.get('hint') or ''} |")
    env = st.get("env") or {}
    if isinstance(env, Mapping) and env:
        out += ["", "<details><summary>The engine's NCCL / CUDA / vLLM environment</summary>", "", "```text"]
        out += [f"{k}={v}" for k, v in sorted(env.items())]
        out += ["```", "", "</details>"]
    out.append("")
    return out


def _frame(f: Any) -> str:
    if not isinstance(f, Mapping):
        return ""
    line = f.get("line")
    return f"{f.get('function')} ({short_path(str(f.get('file')))}{f':{line}' if line else ''})"


def _mark(f: Mapping[str, Any]) -> str:
    if f.get("native"):
        return "· "
    moved = f.get("moved")
    return "~ " if moved is True else "= " if moved is False else "  "


def _cell(value: Any) -> str:
    return str(value or "").replace("|", "/").replace("\n", " ")
