"""The triage checklist, answered from one stored snapshot.

The questions are the ones a crash report of a P/D deployment gets asked first (vLLM version,
connectors, host pool, block size, NCCL_NET_PLUGIN on both engines, CUDA graph mode, the load
at the crash, the per-request state, which workers failed at which step, the Xid). Each item
is data: its value, or ``recorded: false`` when the snapshot cannot answer it, which the page
shows in red. Pure: it reads the snapshot's header, peers and events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NOT_RECORDED = "not recorded"


def _item(key: str, label: str, value: Any, *, recorded: bool | None = None, detail: Any = None) -> dict[str, Any]:
    ok = value is not None if recorded is None else recorded
    out = {"key": key, "label": label, "value": value if ok else None, "recorded": ok, "text": _text(value) if ok else NOT_RECORDED}
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
    fp: Mapping[str, Any] = header.get("fingerprint") or {}
    s: Mapping[str, Any] = header.get("summary") or {}
    engine = str(header.get("engine"))
    reqs: Mapping[str, Any] = s.get("requests_at_last_step") or {}
    items = [
        _item("vllm_version", "vLLM version", fp.get("vllm_version")),
        _item("connectors", "KV connectors", fp.get("connectors") or None, detail=fp.get("kv_transfer_config")),
        _item("host_pool_size", "Host pool size", _gib(fp.get("host_pool_size"))),
        _item("import_prefix_via_host", "Prefixes imported through the host path", fp.get("import_prefix_via_host")),
        _item("block_size", "Block size", fp.get("block_size")),
    ]
    nccl = _engines_env("NCCL_NET_PLUGIN", engine, fp, peers)
    items.append(
        _item(
            "nccl_net_plugin",
            "NCCL_NET_PLUGIN on each engine of the pair",
            nccl,
            recorded=all(v != NOT_RECORDED for v in nccl.values()) and len(nccl) >= 2,
        )
    )
    clb, clb_ok = _env(fp, "CUDA_LAUNCH_BLOCKING")
    items.append(_item("cuda_launch_blocking", "CUDA_LAUNCH_BLOCKING", clb, recorded=clb_ok))
    # the configured mode, and the mode the last recorded step ran (vLLM's --cudagraph-metrics)
    items.append(
        _item(
            "cuda_graph_mode",
            "CUDA graph mode",
            fp.get("cuda_graph_mode"),
            detail={"at_last_step": s.get("cudagraph_at_last_step")} if s.get("cudagraph_at_last_step") else None,
        )
    )
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
    items.append(_item("mirror_rows", "Host-mirror rows per request", reqs.get("mirror_rows") or None))
    failed = s.get("failed_processes") or None
    if failed:
        failed = {proc: f.get("step") for proc, f in failed.items()}
    items.append(_item("failed_workers", "Failed processes and their step", failed))
    xids = s.get("xids") or sorted({e["xid"] for e in events if e.get("xid") is not None}) or None
    items.append(_item("xid", "GPU Xid", xids))
    return items
