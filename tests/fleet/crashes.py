"""Crash snapshots for the fleet tests, shaped as the sidecar stores them: the trigger, the
events the snapshot holds (the Xid with its GPU, the workers' CUDA errors with their frames as
the traceback parser gives them) and the engine's fingerprint."""

from __future__ import annotations

from typing import Any

from collector.snapshot.document import SnapshotDoc
from collector.storage.repo import Repository

SITE = "/usr/local/lib/python3.12/dist-packages/"
# the incident's decode worker: the connector's finish_forward path (PRODUCT.md)
CONNECTOR_FRAMES = [
    ("vllm/v1/executor/multiproc_executor.py", 1058, "worker_busy_loop"),
    ("vllm/v1/worker/gpu/model_runner.py", 1928, "execute_model"),
    ("vllm/v1/worker/gpu/kv_connector.py", 96, "finish_forward"),
    ("vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py", 310, "finish_forward"),
    ("vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py", 831, "finish_forward"),
    ("vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py", 823, "_finish_mirror_phase"),
]


def frames(spec: list[tuple[str, int, str]], *, prefix: str = SITE) -> list[dict[str, Any]]:
    return [{"file": prefix + f, "line": line, "func": func, "code": "", "chain": 0} for f, line, func in spec]


def fingerprint(version: str = "0.11.0", model: str = "deepseek-ai/DeepSeek-V3.2-Exp") -> dict[str, Any]:
    return {"vllm_version": version, "model": model, "connectors": ["MultiConnector", "NixlConnector", "HiSparseConnector"]}


def xid_event(code: int, gpu: str, ts: float) -> dict[str, Any]:
    return {"kind": "xid", "source": "kmsg", "ts": ts, "xid": code, "gpu": gpu, "message": f"NVRM: Xid (PCI:{gpu}): {code}, pid=3107"}


def cuda_event(ts: float, *, process: str = "Worker_TP0", spec: list[tuple[str, int, str]] = CONNECTOR_FRAMES, prefix: str = SITE) -> dict[str, Any]:
    return {
        "kind": "cuda_error",
        "source": "log",
        "ts": ts,
        "process": process,
        "message": "torch.AcceleratorError: CUDA error: unspecified launch failure",
        "frames": frames(spec, prefix=prefix),
    }


def crash_doc(
    host: str,
    engine: str,
    ts: float,
    *,
    xid: int | None = None,
    gpu: str | None = None,
    cuda: bool = True,
    version: str = "0.11.0",
    model: str = "m-1",
) -> SnapshotDoc:
    events = []
    if xid is not None and gpu is not None:
        events.append(xid_event(xid, gpu, ts))
    if cuda:
        events.append(cuda_event(ts + 0.1))
    trigger = dict(events[0]) if events else {"kind": "manual", "message": "m"}
    trigger.pop("frames", None)
    return SnapshotDoc(
        host=host, engine=engine, created_at=ts + 1, fault_ts=ts, trigger=trigger, fingerprint=fingerprint(version, model), events=events
    )


def store(repo: Repository, doc: SnapshotDoc) -> int:
    sid, _ = repo.store_snapshot(doc, incident_window_s=30, incident_key=f"{doc.host}/{doc.engine}/{doc.fault_ts}")
    return sid
