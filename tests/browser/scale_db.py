"""A node at 8 engines x 256 running, stored as the sidecar stores it: two hosts of four engines
(two P/D pairs and four plain engines), one incident, an Xid on one host's GPU, every engine's
snapshot with 256 requests per step; the first with a few hundred steps of them. Built in
memory (the simulator's figures, not its processes): a browser test needs the page's load, not
a node's worth of CPU."""

from __future__ import annotations

import random
from typing import Any

from collector.snapshot.document import SnapshotDoc
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository
from collector.xid.catalog import lookup

T0 = 1_800_000_000.0
RUNNING = 256
HOSTS = ("node-a", "node-b")


def request_id(rnd: random.Random) -> str:
    return f"cmpl-{rnd.getrandbits(128):032x}-0"


def engine_doc(host: str, name: str, *, steps: int, seed: int, pair: str | None, role: str | None, with_events: bool) -> SnapshotDoc:
    rnd = random.Random(seed)
    live = [(request_id(rnd), rnd.randrange(4000), rnd.choice((1024, 8192, 32000))) for _ in range(RUNNING)]
    rows: dict[str, list[Any]] = {
        k: [] for k in ("step", "request_id", "prompt_len", "computed_tokens", "output_tokens", "preemptions", "status", "mirror_rows")
    }
    step_rows = []
    fault = T0 + steps * 0.02 + 0.45  # just after the last step (the last 30 came 0.4 s late)
    for s in range(steps):
        prefill = 0
        for i, (rid, age, isl) in enumerate(live):
            if age > 2000 + rnd.randrange(2000):
                rid, age, isl = request_id(rnd), 0, rnd.choice((1024, 8192, 32000))
                prefill += isl
            live[i] = (rid, age + 1, isl)
            rows["step"].append(s)
            rows["request_id"].append(rid)
            rows["prompt_len"].append(isl)
            rows["computed_tokens"].append(isl + age)
            rows["output_tokens"].append(age)
            rows["preemptions"].append(0)
            rows["status"].append("RUNNING")
            rows["mirror_rows"].append(1 + (isl + age) // 4096)
        step_rows.append(
            {
                "step": s,
                "ts": T0 + s * 0.02 + (0.4 if s >= steps - 30 else 0.0),  # one step stalled 0.4 s
                "running": RUNNING,
                "waiting": rnd.randrange(3),
                "kv_cache_usage": 0.6 + s / steps * 0.3,
                "preemptions": 0,
                "prompt_tokens": min(prefill, 8192),
                "generation_tokens": RUNNING,
                "mirror_rows": sum(rows["mirror_rows"][-RUNNING:]),
                "has_stats": True,
                "has_requests": True,
                "requests": RUNNING,
            }
        )
    last = rows["step"][-1]
    at_last = [i for i, s in enumerate(rows["step"]) if s == last]
    ctx = [rows["computed_tokens"][i] for i in at_last]
    connectors = ["MultiConnector", "NixlConnector", "HiSparseConnector"] if pair else []
    events: list[dict[str, Any]] = []
    if with_events:
        events = [
            {
                "kind": "anomaly",
                "ts": fault - 2.0,
                "source": "detector",
                "message": "stall warning: no step for 0.4 s",
                "severity": "warning",
                "engine": name,
                "uid": f"an-{host}-{name}",
            },
            {
                "kind": "xid",
                "ts": fault,
                "source": "kmsg",
                "sources": ["kmsg", "nvml"],
                "message": "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
                "severity": "critical",
                "xid": 79,
                "gpu": "0000:18:00.0",
                "uid": f"xid-{host}",
                "data": {
                    "catalog": lookup(79).to_dict(),
                    # who the kubelet gave that GPU (the PodResources API), as routing names them
                    "gpu_holders": [
                        {
                            "device": "GPU-4a1b7c2d-0e3f-5a6b-7c8d-9e0f1a2b3c4d",
                            "resource": "nvidia.com/gpu",
                            "namespace": "inference",
                            "pod": "decode-0",
                            "container": "vllm",
                        }
                    ],
                },
            },
            {
                "kind": "cuda_error",
                "ts": fault - 0.5,
                "source": "log",
                "message": "torch.AcceleratorError: CUDA error: unspecified launch failure",
                "severity": "critical",
                "engine": name,
                "process": "Worker_TP0",
                "pid": 4000 + seed,
                "uid": f"cuda-{host}-{name}",
                "lines": ["Traceback (most recent call last):", "RuntimeError: CUDA error"],
            },
        ]
    return SnapshotDoc(
        host=host,
        engine=name,
        created_at=fault + 1,
        fault_ts=fault,
        trigger={"kind": "xid", "source": "kmsg", "message": "Xid 79 (GPU has fallen off the bus) on GPU 0000:18:00.0", "xid": 79},
        summary={
            "step_count": steps,
            "running": RUNNING,
            "kv_cache_usage": step_rows[-1]["kv_cache_usage"],
            "pair": pair,
            "xids": [79],
            "peak_concurrency": RUNNING + 2,
            "requests_at_last_step": {
                "step": last,
                "count": len(at_last),
                "context_len_min": min(ctx),
                "context_len_max": max(ctx),
                "context_len_mean": sum(ctx) / len(ctx),
                "mirror_rows": {rows["request_id"][i]: rows["mirror_rows"][i] for i in at_last} if pair else {},
            },
            "failed_processes": {"Worker_TP0": {"step": last, "kind": "cuda_error", "message": "CUDA error", "pid": 4000 + seed}},
        },
        fingerprint={
            "vllm_version": "0.11.1",
            "model": "m",
            "block_size": 64,
            "connectors": connectors,
            "kv_role": role,
            "host_pool_size": 128 * 2**30 if pair else None,
            "env": {"NCCL_NET_PLUGIN": "none", "CUDA_LAUNCH_BLOCKING": "0"},
        },
        steps=step_rows,
        requests={"columns": rows, "sparse": []},
        events=events,
    )


def build(url: str, *, first_steps: int = 300, other_steps: int = 40) -> list[int]:
    """Store the node's eight snapshots in one incident; returns their ids, node-a/decode-0 first."""
    upgrade(url)
    docs = []
    for h, host in enumerate(HOSTS):
        repo = Repository(make_engine(url), host=host)
        for j in range(4):
            pair = f"pd-{host[-1]}" if j < 2 else None
            role = ("kv_consumer" if j == 0 else "kv_producer") if pair else None
            name = ("decode-0" if j == 0 else "prefill-0") if pair else f"engine-{j}"
            k = h * 4 + j
            doc = engine_doc(host, name, steps=first_steps if k == 0 else other_steps, seed=k, pair=pair, role=role, with_events=True)
            # as the sidecar does at start and on each fingerprint: the pair's peers come from here
            repo.register_engine(name, url=f"http://{host}:{8000 + j}", pair=pair)
            repo.update_engine(name, fingerprint=doc.fingerprint)
            docs.append((repo, doc))
    return [repo.store_snapshot(doc, incident_window_s=60, incident_key="xid:79")[0] for repo, doc in docs]
