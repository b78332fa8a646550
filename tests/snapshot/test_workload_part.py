"""The snapshot's ``workload`` part: exported, stored, and null for snapshots stored without it."""

from __future__ import annotations

import gzip
import json
import time

from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadArrival, WorkloadBatch
from collector.snapshot.document import PARTS, SnapshotDoc, export_gzip, pack
from collector.storage.connect import make_engine
from collector.storage.repo import Repository


def workload() -> dict:
    log = WorkloadLog()
    log.add(WorkloadBatch("decode-0", 1.0, [WorkloadArrival("a", 1.0, 32000, 2000, None, None, None)]))
    return log.export(5.0, crashed=True)


def doc(**kw: object) -> SnapshotDoc:
    ts = time.time()
    return SnapshotDoc(
        host="node-a", engine="decode-0", created_at=ts, fault_ts=ts, trigger={"kind": "cuda_error", "source": "log", "message": "x"}, **kw
    )  # type: ignore[arg-type]


def test_the_export_carries_the_workload_and_reads_it_back() -> None:
    wl = workload()
    out = doc(workload=wl).to_export()
    assert out["workload"] == wl
    assert SnapshotDoc.from_export(json.loads(json.dumps(out))).workload == wl


def test_an_export_without_a_workload_reads_as_null() -> None:
    old = doc().to_export()
    del old["workload"]  # a file exported before the part existed
    assert SnapshotDoc.from_export(old).workload is None
    assert doc().to_export()["workload"] is None


def test_spliced_export_serves_null_for_a_missing_part() -> None:
    d = doc(workload=workload())
    blobs = {name: pack(d.part(name)) for name in PARTS}
    assert json.loads(gzip.decompress(export_gzip(d.header(), blobs)))["workload"] == d.workload
    del blobs["workload"]  # stored before the part existed
    assert json.loads(gzip.decompress(export_gzip(d.header(), blobs)))["workload"] is None


def test_stored_and_read_on_the_database(migrated_url: str) -> None:
    repo = Repository(make_engine(migrated_url), host="node-a")
    with_wl, _ = repo.store_snapshot(doc(workload=workload()), incident_window_s=30, incident_key="k1")
    without, _ = repo.store_snapshot(doc(), incident_window_s=30, incident_key="k2")
    assert repo.get_snapshot(with_wl).workload == workload()
    assert repo.get_snapshot(without).workload is None
    blob_doc, blobs = repo.get_snapshot_blobs(with_wl)
    assert json.loads(gzip.decompress(export_gzip(blob_doc.header(), blobs)))["workload"]["counts"]["requests"] == 1
