"""The bundle to attach upstream: nothing the redaction tests know as a secret survives in it,
request ids are hashed the same everywhere, no prompt content, host names masked unless kept,
and a 4,096-step x 256-request snapshot fits in 10 MB."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from collector.report.bundle import MAX_BUNDLE_BYTES, BundleTooLarge, build_bundle
from collector.report.markdown import render
from collector.report.scrub import hash_request_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import big_export  # noqa: E402
from test_redact import AWS_SECRET, TEXT  # noqa: E402  (every secret form the redaction tests know)

HOST = "gpu-node-17.corp.example"
PEER_HOST = "gpu-node-18.corp.example"
RID = "cmpl-0123456789abcdef0123456789abcdef-0"
RID2 = "chatcmpl-fedcba9876543210fedcba9876543210"
PROMPT = "Tell me the launch codes of the Andromeda project"
PROMPT_IDS = [918273, 645372, 112233, 998877]
STRUCT_SECRETS = ("hf_short", AWS_SECRET, "t0k", "sk-123456789", "hf_abcdefgh1", "sk-zzzzzzzz")


def secret_export() -> dict[str, Any]:
    """A snapshot export with every known secret form wherever a snapshot holds text."""
    texts = [t for t, _, _ in TEXT]
    fp = {
        "vllm_version": "0.11.1",
        "model": "m",
        "hostname": HOST,
        "server_host": HOST,
        "env": {"HF_TOKEN": "hf_short", "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "NCCL_DEBUG": "INFO"},
        "kv_transfer_config": {
            "kv_connector": "NixlConnector",
            "kv_connector_extra_config": {"backend": "redis://u:PW@h:1", "headers": {"authorization": "Bearer t0k"}},
        },
        "argv": ["vllm", "serve", "m", "--api-key", "sk-123456789", "--port", "8000"],
        "args_tuple": ["--hf-token", "hf_abcdefgh1"],
        "non_default_args": "{'api_key': ['sk-zzzzzzzz']}",
        "connectors": ["NixlConnector"],
        "kv_role": "kv_consumer",
    }
    return {
        "schema": "flightrec.snapshot/v1",
        "id": 5,
        "incident_id": 2,
        "host": HOST,
        "engine": "decode-0",
        "created_at": 1_800_000_001.0,
        "fault_ts": 1_800_000_000.0,
        "trigger": {"kind": "cuda_error", "source": "log", "message": texts[0] + f" for {RID}"},
        "summary": {"requests_at_last_step": {"step": 2, "count": 2, "mirror_rows": {RID: 1, RID2: 3}}, "failed_processes": {}},
        "fingerprint": fp,
        "steps": [{"step": i, "ts": 1_799_999_999.0 + i * 0.1, "running": 2, "waiting": 0} for i in range(3)],
        "requests": {
            "columns": {
                "step": [1, 1, 2, 2],
                "request_id": [RID, RID2, RID, RID2],
                "computed_tokens": [10, 20, 11, 21],
                "status": ["RUNNING"] * 4,
                "prompt_token_ids": [PROMPT_IDS] * 4,
            },
            "sparse": [],
        },
        "gpu_samples": [],
        "events": [
            {
                "kind": "crash_dump",
                "ts": 1_800_000_000.0,
                "source": "log",
                "message": "crash dump",
                "lines": [f"NewRequestData(req_id={RID}, prompt_token_ids={PROMPT_IDS}, prompt='{PROMPT}')"],
                "data": {"requests": [{"request_id": RID, "prompt": PROMPT, "prompt_token_ids": PROMPT_IDS, "num_computed_tokens": 11}]},
            },
            {
                "kind": "engine_down",
                "ts": 1_800_000_003.0,
                "source": "scrape",
                "message": f"engine down at http://{HOST}:8000",
                "data": {"url": f"http://{HOST}:8000"},
            },
            *[
                {
                    "kind": "cuda_error",
                    "ts": 1_800_000_000.0,
                    "source": "log",
                    "process": "Worker_TP0",
                    "message": t,
                    "lines": ["Traceback (most recent call last):", t],
                }
                for t in texts
            ],
        ],
        "log_lines": [{"ts": 1_800_000_000.0, "line": t} for t in texts] + [{"ts": 1_800_000_000.0, "line": f"{RID} on {HOST} prompt={PROMPT!r}"}],
        "peers": [
            {"host": PEER_HOST, "engine": "prefill-0", "role": "kv_producer", "fingerprint": {**fp, "hostname": PEER_HOST, "kv_role": "kv_producer"}}
        ],
        "workload": {"requests": {"columns": {"id": [RID, RID2], "prompt_len": [10, 20], "prompt": [PROMPT, PROMPT]}}},
    }


def unpack(body: bytes) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _forms(secret: str) -> list[str]:
    return [secret, json.dumps(secret)[1:-1]]  # as written, and as JSON escapes it


def test_no_secret_prompt_or_raw_request_id_is_left_in_the_bundle() -> None:
    files = unpack(build_bundle(secret_export(), report=render))
    assert set(files) == {"report.md", "snapshot.json", "MANIFEST.txt"}
    everything = "\n".join(files.values())
    gone = [g for _, secrets, _ in TEXT for g in secrets] + list(STRUCT_SECRETS)
    for secret in gone:
        for form in _forms(secret):
            assert form not in everything, f"{secret!r} left in the bundle"
    for raw in (RID, RID2, PROMPT, "918273", HOST, PEER_HOST, "corp.example", "@cache:", "db.internal", "//host:8000"):
        assert raw not in everything, raw
    # the same hash everywhere: columns, the workload, the summary's map, text
    snap = json.loads(files["snapshot.json"])
    h1, h2 = hash_request_id(RID), hash_request_id(RID2)
    assert snap["requests"]["columns"]["request_id"] == [h1, h2, h1, h2]
    assert snap["workload"]["requests"]["columns"]["id"] == [h1, h2]
    assert set(snap["summary"]["requests_at_last_step"]["mirror_rows"]) == {h1, h2}
    assert h1 in snap["log_lines"][-1]["line"] and h1 in snap["events"][0]["data"]["requests"][0]["request_id"]
    assert "prompt_token_ids" not in snap["requests"]["columns"] and "prompt" not in snap["workload"]["requests"]["columns"]
    assert snap["host"] == "host-1" and snap["peers"][0]["host"] == "host-2" and "host-1:8000" in snap["events"][1]["message"]
    # what is not secret stays: the report is still a report
    assert snap["fingerprint"]["env"]["NCCL_DEBUG"] == "INFO" and snap["requests"]["columns"]["computed_tokens"] == [10, 20, 11, 21]
    assert "request ids: 2 distinct" in files["MANIFEST.txt"] and "host names: 6 replaced" in files["MANIFEST.txt"]  # 2 named, 4 in URLs


def test_host_names_are_kept_on_request() -> None:
    files = unpack(build_bundle(secret_export(), keep_hostnames=True, report=render))
    assert HOST in files["snapshot.json"] and PEER_HOST in files["snapshot.json"]
    assert AWS_SECRET not in files["snapshot.json"] and RID not in files["snapshot.json"]


@pytest.mark.slow
def test_a_4096_step_x_256_request_snapshot_fits_in_10_mb() -> None:
    export = big_export(4096, 256)
    assert len(export["requests"]["columns"]["step"]) == 4096 * 256
    body = build_bundle(export, report=render)
    assert len(body) <= MAX_BUNDLE_BYTES, len(body)
    print(f"bundle of 4096 x 256: {len(body) / 1e6:.2f} MB")


def test_a_bundle_over_the_limit_is_refused_with_its_size() -> None:
    with pytest.raises(BundleTooLarge, match="MB, over the"):
        build_bundle(secret_export(), report=render, max_bytes=100)
