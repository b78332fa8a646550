"""An engine's fingerprint holds what both of its recorders wrote: the API server's facts and the
engine core's (``scheduler_base``, the scheduler class it really runs on, is known only there),
whichever arrives last; a restarted server starts afresh."""

from __future__ import annotations

from collector.ingest.fingerprints import merge_fingerprint

API = {"pid": 100, "server_pid": 100, "async_scheduling": True, "vllm_version": "0.26.0"}
CORE = {"pid": 140, "server_pid": 100, "scheduler_base": "vllm.v1.core.sched.async_scheduler.AsyncScheduler", "async_scheduling": True}


def test_the_engine_cores_facts_survive_the_api_servers_that_arrive_after_them() -> None:
    merged = merge_fingerprint(merge_fingerprint({}, CORE), API)
    assert merged["scheduler_base"].endswith("AsyncScheduler")
    assert merged["pid"] == 100 and merged["engine_core_pid"] == 140  # the server's pid stays the engine's
    assert merged["vllm_version"] == "0.26.0"


def test_either_order_gives_the_same_fingerprint() -> None:
    assert merge_fingerprint(merge_fingerprint({}, API), CORE) == merge_fingerprint(merge_fingerprint({}, CORE), API)


def test_a_new_server_process_replaces_what_the_old_one_said() -> None:
    merged = merge_fingerprint(merge_fingerprint({}, CORE), API)
    restarted = {"pid": 300, "server_pid": 300, "async_scheduling": False}
    assert merge_fingerprint(merged, restarted) == restarted


def test_the_same_side_again_updates_its_facts_and_keeps_the_others() -> None:
    merged = merge_fingerprint(merge_fingerprint({}, CORE), API)
    again = {**API, "vllm_version": "0.26.1"}
    out = merge_fingerprint(merged, again)
    assert out["vllm_version"] == "0.26.1" and out["scheduler_base"] == CORE["scheduler_base"]


def test_the_hub_keeps_both_halves(tmp_path: object) -> None:
    from collector.ingest.hub import hub_for
    from collector.model import Fingerprint
    from collector.settings import EngineConfig, Settings

    hub = hub_for(Settings(engines=[EngineConfig(name="e", url="http://127.0.0.1:8000")]))
    hub.emit(Fingerprint(engine="e", ts=1.0, facts=CORE))
    hub.emit(Fingerprint(engine="e", ts=2.0, facts=API))
    info = hub.view.engine("e")
    assert info is not None and info.fingerprint["scheduler_base"] == CORE["scheduler_base"]


def test_a_restart_under_the_same_pids_is_told_by_its_run() -> None:
    # a container's pids repeat across restarts: its run id (the server's start time) does not
    merged = merge_fingerprint(merge_fingerprint({}, {**CORE, "run": 1}), {**API, "run": 1})
    assert merged["engine_core_pid"] == 140
    restarted = {**API, "run": 2, "async_scheduling": False}
    assert merge_fingerprint(merged, restarted) == restarted
