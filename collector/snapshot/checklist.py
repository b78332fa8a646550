"""The triage checklist, answered from one stored snapshot.

The questions follow the fault: what it was and the Xid's class (the program or the GPU),
which processes failed at which step, what the detectors saw before; then the connectors in
use and only the questions that depend on them (NCCL on both engines of a P/D pair; the host
pool, host imports and host-mirror rows where a host-memory connector runs); the engine's
configuration; the load at the crash. Each item is data: its value and ``status``: recorded,
``not_recorded`` (the snapshot cannot answer: red on the page) or ``not_exposed`` (no vLLM
release exposes it: grey). Pure: it reads the snapshot's header, peers and events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NOT_RECORDED = "not recorded"


RECORDED, MISSING, NOT_EXPOSED = "recorded", "not_recorded", "not_exposed"
NOT_EXPOSED_TEXT = "not exposed by this vLLM"
# Connectors whose requests keep rows in host memory (the HiSparse host mirror, CPU offload).
HOST_CONNECTORS = ("HiSparseConnector", "OffloadingConnector", "LMCacheConnectorV1", "LMCacheConnector")
# P/D transfer connectors: NCCL settings of both engines of the pair matter.
PD_CONNECTORS = ("NixlConnector", "P2pNcclConnector", "MooncakeConnector", "MultiConnector")
DETECTORS_SHOWN = 6
MOST_MIRROR_ROWS = 5


def _item(
    key: str, label: str, value: Any, *, recorded: bool | None = None, detail: Any = None, status: str | None = None, text: str | None = None
) -> dict[str, Any]:
    ok = value is not None if recorded is None else recorded
    st = status or (RECORDED if ok else MISSING)
    ok = ok and st == RECORDED
    if not ok:
        text = NOT_EXPOSED_TEXT if st == NOT_EXPOSED else NOT_RECORDED
    elif text is None:
        text = _text(value)
    out = {"key": key, "label": label, "value": value if ok else None, "recorded": ok, "status": st, "text": text}
    if detail is not None:
        out["detail"] = detail
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    return str(value)


def _gib(n: Any) -> Any:
    if isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 2**30:
        return f"{n / 2**30:g} GiB"
    return n


def _env(fp: Mapping[str, Any], name: str) -> tuple[Any, bool]:
    """(value, recorded): a recorded env without the variable means it was unset."""
    env = fp.get("env")
    if not isinstance(env, Mapping):
        return None, False
    return env.get(name, "unset"), True


def _engines_env(name: str, engine: str, fp: Mapping[str, Any], peers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    v, ok = _env(fp, name)
    values[engine] = v if ok else NOT_RECORDED
    for p in peers:
        pv, pok = _env(p.get("fingerprint") or {}, name)
        values[str(p.get("engine"))] = pv if pok else NOT_RECORDED
    return values


def checklist(header: Mapping[str, Any], peers: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The items in the order the fault asks them: the fault itself (its kind, the Xid and its
    class, the failed processes, what the detectors saw before), then the connectors in use and
    what depends on them (asked only where such a connector runs), the engine's configuration,
    and the load at the crash."""
    fp: Mapping[str, Any] = header.get("fingerprint") or {}
    s: Mapping[str, Any] = header.get("summary") or {}
    engine = str(header.get("engine"))
    trig: Mapping[str, Any] = header.get("trigger") or {}
    reqs: Mapping[str, Any] = s.get("requests_at_last_step") or {}
    connectors = [str(c) for c in fp.get("connectors") or []]
    items = [_item("fault", "The fault", f"{trig.get('kind', '?')}: {trig.get('message', '')}" if trig else None)]
    # a snapshot taken by hand or by a detector has no crash to explain: its Xid and failed
    # processes are asked only when it holds them
    crash = trig.get("kind") not in ("manual", "anomaly")
    xid = _xid_item(s, events)
    if crash or xid["recorded"]:
        items.append(xid)
    failed = s.get("failed_processes") or None
    if failed:
        failed = {proc: f.get("step") for proc, f in failed.items()}
    if crash or failed:
        items.append(_item("failed_workers", "Failed processes and their step", failed))
    items.append(_detectors_item(header, events))
    if _has_cuda_error(trig, events):  # a CUDA error is reported asynchronously unless this is 1
        clb, clb_ok = _env(fp, "CUDA_LAUNCH_BLOCKING")
        items.append(_item("cuda_launch_blocking", "CUDA_LAUNCH_BLOCKING", clb, recorded=clb_ok))

    # an empty list is an answer (no connector configured); an absent key is not
    has_list = isinstance(fp.get("connectors"), list)
    items.append(
        _item("connectors", "KV connectors in use", connectors or ("none configured" if has_list else None), detail=fp.get("kv_transfer_config"))
    )
    if any(c in PD_CONNECTORS for c in connectors) or peers:
        nccl = _engines_env("NCCL_NET_PLUGIN", engine, fp, peers)
        items.append(
            _item(
                "nccl_net_plugin",
                "NCCL_NET_PLUGIN on each engine of the pair",
                nccl,
                recorded=all(v != NOT_RECORDED for v in nccl.values()) and len(nccl) >= 2,
            )
        )
    mirror = reqs.get("mirror_rows") or None
    if any(c in HOST_CONNECTORS for c in connectors) or fp.get("host_pool_size") is not None or _counted(mirror):
        items.append(_item("host_pool_size", "Host pool size", _gib(fp.get("host_pool_size"))))
        items.append(_imports_item(s))
        items.append(_mirror_item(mirror))

    items.append(_item("vllm_version", "vLLM version", fp.get("vllm_version")))
    items.append(_item("block_size", "Block size", fp.get("block_size")))
    # the configured mode, and the mode the last recorded step ran (vLLM's --cudagraph-metrics)
    items.append(
        _item(
            "cuda_graph_mode",
            "CUDA graph mode",
            fp.get("cuda_graph_mode"),
            detail={"at_last_step": s.get("cudagraph_at_last_step")} if s.get("cudagraph_at_last_step") else None,
        )
    )
    if not _has_cuda_error(trig, events):
        clb, clb_ok = _env(fp, "CUDA_LAUNCH_BLOCKING")
        items.append(_item("cuda_launch_blocking", "CUDA_LAUNCH_BLOCKING", clb, recorded=clb_ok))
    items.append(
        _item(
            "load_concurrency",
            "Load at the crash (peak running + waiting in the ring)",
            s.get("peak_concurrency"),
            detail={"at_last_step": s.get("concurrency_at_fault")},
        )
    )
    items.append(_item("running", "Running requests at the last step", s.get("running")))
    ctx = None
    if reqs:
        ctx = {"min": reqs.get("context_len_min"), "mean": round(float(reqs.get("context_len_mean") or 0)), "max": reqs.get("context_len_max")}
    items.append(_item("context_lengths", "Context lengths at the last step", ctx))
    items.append(_item("kv_cache_usage", "kv_cache_usage at the last step", s.get("kv_cache_usage")))
    items.append(_item("preemptions", "Preemptions in the recorded steps", s.get("preemptions_in_ring")))
    return items


def _counted(mirror: Mapping[str, Any] | None) -> bool:
    return any(isinstance(v, (int, float)) for v in (mirror or {}).values())


def _has_cuda_error(trig: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> bool:
    return trig.get("kind") == "cuda_error" or any(e.get("kind") == "cuda_error" for e in events)


def _xid_item(s: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The Xid codes and each one's class from the catalog (application, driver, hardware...):
    the first fork of a triage, the program or the GPU."""
    from collector.xid.catalog import lookup

    codes = s.get("xids") or sorted({int(e["xid"]) for e in events if e.get("xid") is not None}) or None
    if not codes:
        return _item("xid", "GPU Xid and its class", None)
    classes = {}
    for code in codes:
        info = lookup(int(code))
        classes[f"Xid {code}"] = f"{info.name} ({info.category}, {info.severity.value}): {info.action}"
    text = ", ".join(f"{code} ({lookup(int(code)).name}: {lookup(int(code)).category})" for code in codes)
    return _item("xid", "GPU Xid and its class", list(codes), detail=classes, text=text)


def _detectors_item(header: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The detectors' state changes up to the fault, newest last (the snapshot holds the
    engine's and the host's events of its window)."""
    fault = header.get("fault_ts")
    seen = [e for e in events if e.get("kind") == "anomaly" and (fault is None or (e.get("ts") or 0) <= fault + 1.0)]
    seen.sort(key=lambda e: e.get("ts") or 0)
    if not seen:
        return _item("detectors_before", "What the detectors saw before", "no detector changed state in the snapshot's window")
    lines = {}
    for e in seen[-DETECTORS_SHOWN:]:
        ts = e.get("ts")
        when = f"{ts - fault:+.1f} s" if isinstance(ts, (int, float)) and isinstance(fault, (int, float)) else "?"
        lines[when] = str(e.get("message") or "")
    value = f"{len(seen)} state change(s); last: {seen[-1].get('message')}"
    return _item("detectors_before", "What the detectors saw before", value, detail=lines)


def _imports_item(s: Mapping[str, Any]) -> dict[str, Any]:
    """No released vLLM has a setting or figure named "prefixes imported through the host";
    what it does expose is the external prefix cache's hits (the connector's), shown when the
    last scrape has them."""
    values = (s.get("last_scrape") or {}).get("values") or {}
    ext = {k: v for k, v in values.items() if "external_prefix_cache" in k} if isinstance(values, Mapping) else {}
    label = "Prefixes imported through the host path"
    if ext:
        hits = next((v for k, v in ext.items() if "hits" in k), None)
        queries = next((v for k, v in ext.items() if "queries" in k), None)
        text = (
            f"external prefix cache: {hits:g} of {queries:g} tokens hit"
            if isinstance(hits, (int, float)) and isinstance(queries, (int, float))
            else ext
        )
        return _item("import_prefix_via_host", label, text, detail=ext)
    return _item("import_prefix_via_host", label, None, status=NOT_EXPOSED)


def _mirror_item(mirror: Mapping[str, Any] | None) -> dict[str, Any]:
    """A summary, not a paragraph of ids: the total, the per-request distribution, the few
    requests with the most rows (the page links the table for the rest)."""
    rows = {str(k): v for k, v in (mirror or {}).items() if isinstance(v, (int, float))}
    if not rows:
        return _item("mirror_rows", "Host-mirror rows per request", None)
    values = sorted(rows.values())
    most = sorted(rows.items(), key=lambda kv: -kv[1])[:MOST_MIRROR_ROWS]
    value = {
        "total": sum(values),
        "requests": len(values),
        "min": values[0],
        "p50": values[len(values) // 2],
        "p90": values[min(len(values) - 1, int(len(values) * 0.9))],
        "max": values[-1],
    }
    return _item("mirror_rows", "Host-mirror rows per request", value, detail={rid: n for rid, n in most})
