"""The crash signature: the same crash on other hosts, GPUs and install paths is one id; a
different Xid, CUDA error, frames, version, model or connector is another; where it happened
is never part of it."""

from __future__ import annotations

import pytest

from collector.fleet.signature import compute, for_snapshot, normalise_frame
from tests.fleet.crashes import CONNECTOR_FRAMES, crash_doc, cuda_event, fingerprint, xid_event

T = 1_796_000_000.0


@pytest.mark.parametrize(
    ("path", "func", "want"),
    [
        (
            "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/model_runner.py",
            "execute_model",
            "vllm/v1/worker/gpu/model_runner.py:execute_model",
        ),
        (
            "/home/u/.venv/lib/python3.11/site-packages/vllm/v1/worker/gpu/model_runner.py",
            "execute_model",
            "vllm/v1/worker/gpu/model_runner.py:execute_model",
        ),
        ("/opt/conda/lib/python3.10/site-packages/torch/cuda/streams.py", "synchronize", "torch/cuda/streams.py:synchronize"),
        ("/srv/app/launcher.py", "main", "launcher.py:main"),
    ],
)
def test_frames_lose_their_install_prefix_and_line(path: str, func: str, want: str) -> None:
    assert normalise_frame({"file": path, "line": 12, "func": func}) == want


def test_the_same_crash_on_another_host_gpu_and_install_has_one_signature() -> None:
    a = compute({"kind": "xid", "xid": 43}, [xid_event(43, "0000:18:00.0", T), cuda_event(T)], fingerprint())
    b = compute(
        {"kind": "xid", "xid": 43},
        [xid_event(43, "0000:9a:00.0", T + 99), cuda_event(T + 99, prefix="/venv/lib/python3.12/site-packages/")],
        fingerprint(),
    )
    assert a.id == b.id
    assert a.cuda_error == "unspecified launch failure" and a.exception == "torch.AcceleratorError" and a.xid == [43]
    assert a.frames == [
        "vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py:_finish_mirror_phase"
        " < vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py:finish_forward"
        " < vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py:finish_forward"
    ]
    assert a.connector == "MultiConnector,NixlConnector,HiSparseConnector"


@pytest.mark.parametrize(
    "change",
    ["xid", "version", "model", "frames", "connector"],
)
def test_each_field_tells_crashes_apart(change: str) -> None:
    base = compute({"kind": "xid", "xid": 43}, [xid_event(43, "g", T), cuda_event(T)], fingerprint())
    events = [xid_event(79 if change == "xid" else 43, "g", T), cuda_event(T, spec=CONNECTOR_FRAMES[:3] if change == "frames" else CONNECTOR_FRAMES)]
    fp = fingerprint(version="0.12.0" if change == "version" else "0.11.0", model="other" if change == "model" else "deepseek-ai/DeepSeek-V3.2-Exp")
    if change == "connector":
        fp["connectors"] = ["NixlConnector"]
    assert compute({"kind": "xid"}, events, fp).id != base.id


@pytest.mark.parametrize(
    ("xid", "cuda", "want"),
    [
        (79, False, "hardware"),
        (48, True, "hardware"),
        (74, False, "hardware"),
        (43, True, "software"),
        (13, False, "software"),
        (None, True, "software"),
        (None, False, "unknown"),
    ],
)
def test_fault_class_from_the_xid_catalog_and_the_error(xid: int | None, cuda: bool, want: str) -> None:
    doc = crash_doc("h", "e", T, xid=xid, gpu="g" if xid else None, cuda=cuda)
    cols, detail = for_snapshot(doc)
    assert cols["fault_class"] == want == detail["fault_class"]
    assert cols["gpu"] == ("g" if xid else None) and cols["xid"] == xid and cols["signature"] == detail["id"]


def test_late_evidence_amends_the_stored_signature(migrated_url: str) -> None:
    """The demo's shape: the Xid opens the snapshot, which is committed from its header (a spooled
    document holds no events part); the workers' CUDA errors and frames arrive as late evidence,
    with the amendment and after it. The stored signature is the one of all the evidence."""
    from sqlalchemy import select

    from collector.model import Event, EventKind, Severity
    from collector.snapshot.document import SnapshotDoc
    from collector.storage.connect import make_engine
    from collector.storage.models import SnapshotRow
    from collector.storage.repo import Repository
    from collector.storage.snapshots import SnapshotAmend, SnapshotCommit
    from collector.storage.writer import event_row
    from tests.fleet.crashes import frames

    repo = Repository(make_engine(migrated_url), host="node-a")
    ts = 1_700_000_000.0
    xid = Event(
        kind=EventKind.XID,
        ts=ts,
        source="kmsg",
        message="NVRM: Xid (PCI:0000:00:06): 43, pid=3107",
        xid=43,
        gpu="0000:00:06.0",
        severity=Severity.WARNING,
        uid="x1",
    )
    cuda = "torch.AcceleratorError: CUDA error: unspecified launch failure"
    tp0 = Event(kind=EventKind.CUDA_ERROR, ts=ts + 0.1, source="log", message=cuda, process="Worker_TP0", frames=frames(CONNECTOR_FRAMES), uid="c0")
    tp1_frames = frames([("vllm/v1/worker/gpu/async_utils.py", 168, "get_output")])
    tp1 = Event(kind=EventKind.CUDA_ERROR, ts=ts + 0.2, source="log", message=cuda, process="Worker_TP1", frames=tp1_frames, uid="c1")

    def header() -> SnapshotDoc:
        return SnapshotDoc(host="node-a", engine="decode-0", created_at=ts + 1, fault_ts=ts, trigger=xid.to_dict(), fingerprint=fingerprint())

    [(sid, _)] = repo.commit_snapshots([SnapshotCommit(header(), incident_key="k", events=[event_row(xid)])], incident_window_s=30)
    first = repo.get_snapshot(sid, parts=()).summary["signature"]
    assert first["xid"] == [43] and first["cuda_error"] is None and first["frames"] == []

    repo.commit_snapshots([SnapshotAmend(sid, header(), events=[event_row(xid), event_row(tp0)])], incident_window_s=30)
    amended = repo.get_snapshot(sid, parts=()).summary["signature"]
    assert amended["cuda_error"] == "unspecified launch failure" and amended["exception"] == "torch.AcceleratorError"
    assert len(amended["frames"]) == 1 and amended["xid"] == [43]

    # the second worker's traceback, after the amendment: linked, and the signature amended again
    repo.link_event(event_row(tp1), sid)
    last = repo.get_snapshot(sid, parts=()).summary["signature"]
    assert len(last["frames"]) == 2 and len({first["id"], amended["id"], last["id"]}) == 3
    whole = compute(xid.to_dict(), [event_row(e) for e in (xid, tp0, tp1)], fingerprint())
    assert last["id"] == whole.id  # what one computation over all of it gives
    with make_engine(migrated_url).connect() as conn:  # the column the fleet view groups by
        column = conn.execute(select(SnapshotRow.signature).where(SnapshotRow.id == sid)).scalar_one()
    assert column == last["id"]
