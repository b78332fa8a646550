"""The checklist asks what the fault asks: a P/D crash with an Xid gets the Xid's class, the
pair's NCCL settings and the host-memory questions; a manual snapshot of a plain engine does
not get a red "not recorded" for questions that do not apply."""

from __future__ import annotations

from typing import Any

from collector.snapshot.checklist import checklist


def keys(items: list[dict[str, Any]]) -> list[str]:
    return [i["key"] for i in items]


def test_a_manual_snapshot_of_a_plain_engine_asks_no_crash_or_connector_questions() -> None:
    header = {"engine": "e0", "trigger": {"kind": "manual", "message": "drill"}, "fingerprint": {"connectors": [], "vllm_version": "0.11.1"}}
    items = checklist(header, [], [])
    assert not {"xid", "failed_workers", "nccl_net_plugin", "host_pool_size", "mirror_rows", "import_prefix_via_host"} & set(keys(items))
    conn = next(i for i in items if i["key"] == "connectors")
    assert conn["recorded"] and conn["text"] == "none configured"  # an empty list is an answer


def test_a_pd_crash_with_an_xid_asks_the_xid_class_and_the_connector_questions() -> None:
    header = {
        "engine": "decode-0",
        "fault_ts": 100.0,
        "trigger": {"kind": "xid", "message": "Xid 79"},
        "fingerprint": {"connectors": ["NixlConnector", "HiSparseConnector"], "host_pool_size": 2**37, "env": {"NCCL_NET_PLUGIN": "none"}},
        "summary": {"xids": [79], "requests_at_last_step": {"mirror_rows": {"a": 2, "b": 9, "c": 4}}},
    }
    events = [
        {"kind": "anomaly", "ts": 90.0, "message": "stall warning: no step for 2 s"},
        {"kind": "anomaly", "ts": 200.0, "message": "after the fault: not shown"},
        {"kind": "cuda_error", "ts": 99.5, "message": "CUDA error"},
    ]
    items = {i["key"]: i for i in checklist(header, [{"engine": "prefill-0", "fingerprint": {"env": {}}}], events)}
    order = list(items)
    assert order[:5] == ["fault", "xid", "failed_workers", "detectors_before", "cuda_launch_blocking"]
    assert items["xid"]["value"] == [79] and items["xid"]["text"] == "79 (GPU has fallen off the bus: hardware)"
    assert "reboot" in items["xid"]["detail"]["Xid 79"]
    assert items["detectors_before"]["detail"] == {"-10.0 s": "stall warning: no step for 2 s"}
    assert items["nccl_net_plugin"]["value"] == {"decode-0": "none", "prefill-0": "unset"}
    assert items["mirror_rows"]["value"] == {"total": 15, "requests": 3, "min": 2, "p50": 4, "p90": 9, "max": 9}
    assert list(items["mirror_rows"]["detail"]) == ["b", "c", "a"]  # the most rows first
    imports = items["import_prefix_via_host"]
    assert imports["status"] == "not_exposed" and not imports["recorded"] and imports["text"] == "not exposed by this vLLM"


def test_what_vllm_does_expose_of_host_imports_is_shown() -> None:
    header = {
        "engine": "d",
        "trigger": {"kind": "cuda_error", "message": "x"},
        "fingerprint": {"connectors": ["HiSparseConnector"]},
        "summary": {"last_scrape": {"values": {"external_prefix_cache_hits_total": 300.0, "external_prefix_cache_queries_total": 1000.0}}},
    }
    imports = next(i for i in checklist(header, [], []) if i["key"] == "import_prefix_via_host")
    assert imports["status"] == "recorded" and imports["text"] == "external prefix cache: 300 of 1000 tokens hit"
