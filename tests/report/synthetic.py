"""A node-sized snapshot export built in memory: ``steps`` x ``running`` request rows with the
columns, id turnover and step records the recorder writes (for the bundle's size bound)."""

from __future__ import annotations

import random
from typing import Any


def big_export(steps: int = 4096, running: int = 256, *, life: int = 2000, seed: int = 7) -> dict[str, Any]:
    rnd = random.Random(seed)
    t0 = 1_800_000_000.0
    live = [(f"cmpl-{rnd.getrandbits(128):032x}-0", rnd.randrange(life)) for _ in range(running)]
    cols: dict[str, list[Any]] = {
        k: [] for k in ("step", "request_id", "prompt_len", "computed_tokens", "output_tokens", "preemptions", "status", "mirror_rows", "host_blocks")
    }
    step_rows = []
    for s in range(steps):
        for i, (rid, age) in enumerate(live):
            if age >= life:
                rid, age = f"cmpl-{rnd.getrandbits(128):032x}-0", 0
            live[i] = (rid, age + 1)
            cols["step"].append(s)
            cols["request_id"].append(rid)
            cols["prompt_len"].append(32000)
            cols["computed_tokens"].append(32000 + age)
            cols["output_tokens"].append(age)
            cols["preemptions"].append(0)
            cols["status"].append("RUNNING")
            cols["mirror_rows"].append(1)
            cols["host_blocks"].append(500 + age // 64)
        step_rows.append(
            {
                "step": s,
                "ts": t0 + s * 0.01 + rnd.random() * 0.001,
                "running": running,
                "waiting": 0,
                "kv_cache_usage": round(0.5 + rnd.random() * 0.01, 6),
                "preemptions": 0,
                "prompt_tokens": 0,
                "generation_tokens": running,
                "finished": 0,
                "mirror_rows": running,
                "host_blocks": 7000 + s,
                "connector": {f"NixlConnector.m{k}.sum": rnd.random() for k in range(12)},
                "has_requests": True,
                "has_stats": True,
                "requests": running,
            }
        )
    return {
        "schema": "flightrec.snapshot/v1",
        "id": 9,
        "incident_id": 3,
        "host": "gpu-node-17.corp.example",
        "engine": "decode-0",
        "created_at": t0 + steps * 0.01,
        "fault_ts": t0 + steps * 0.01,
        "trigger": {"kind": "xid", "source": "kmsg", "message": "Xid 79 on GPU 0", "xid": 79},
        "summary": {"xids": [79]},
        "fingerprint": {"vllm_version": "0.11.1", "model": "m", "hostname": "gpu-node-17.corp.example"},
        "steps": step_rows,
        "requests": {"columns": cols, "sparse": []},
        "gpu_samples": [],
        "events": [],
        "log_lines": [],
        "peers": [],
        "workload": None,
    }
