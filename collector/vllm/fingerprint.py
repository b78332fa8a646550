"""Internal: the deployment fingerprint of one engine, read from vLLM's config: the facts a crash triage
checklist asks for. Duck-typed over ``VllmConfig`` (every field read with a default), so it is
tested without vLLM and survives fields that move between vLLM versions.

Keys: vllm_version, model, served_model_name, tensor_parallel_size, pipeline_parallel_size,
data_parallel_size, engine_index, block_size, kv_transfer_config, connectors, kv_role,
kv_buffer_device, host_pool_gib and host_pool_size (bytes) of the HiSparse connector, hisparse
(``attention_config.hisparse_config``: eager_host_mirror, device_buffer_size), nixl (the
NixlConnector extra-config keys vLLM reads, as configured), offload_cpu_bytes
(OffloadingConnector's ``cpu_bytes_to_use``), cuda_graph_mode, compilation_mode, enforce_eager,
max_num_seqs, max_model_len, env, hostname, pid; and, where known, dtype, kv_cache_dtype,
enable_prefix_caching, async_scheduling, scheduler_cls, device; the RecordingScheduler adds
scheduler_base (the class it runs on). A value that
is not configured is null.

Only keys vLLM reads are recorded. No vLLM setting says "prefixes are imported through the host"
(with HiSparse, external imports always land in host pages: single_type_kv_cache_manager.py),
so the fingerprint has no such key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from typing import Any

from collector.recorder.identity import EngineIdentity
from collector.redact import redact

ENV_PREFIXES = ("NCCL_", "VLLM_")
ENV_NAMES = ("CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES")
# NixlConnector's extra-config keys (vllm/distributed/kv_transfer/kv_connector/v1/nixl/).
NIXL_KEYS = (
    "backends",
    "kv_lease_duration",
    "bidirectional_kv_xfer",
    "num_threads",
    "engine_ttl",
    "enforce_handshake_compat",
    "kv_recompute_threshold",
    "decoder_kv_blocks_ttl",
    "push_registration_timeout",
)
GIB = 1 << 30
V1_RUNNER_REMOVED = (0, 34)  # vLLM's release without the V1 GPU model runner (scripts/check_vllm_api.py)


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
    return default if obj is None else obj


def _enum_name(value: Any) -> Any:
    if value is None:
        return None
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)


def as_plain(value: Any, depth: int = 0) -> Any:
    """A config object (dataclass, pydantic model, enum, path) as JSON-able data."""
    if depth > 8:
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): as_plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [as_plain(v, depth + 1) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_plain(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return as_plain(dump(), depth + 1)
        except Exception:  # noqa: BLE001 - a config we cannot dump is still named
            return str(value)
    if hasattr(value, "name") and hasattr(value, "value"):
        return _enum_name(value)
    return str(value)


def connector_names(kv_transfer: Mapping[str, Any] | None) -> list[str]:
    """Connector class names, flattened through MultiConnector's ``connectors`` list."""
    if not kv_transfer:
        return []
    names: list[str] = []
    name = kv_transfer.get("kv_connector")
    extra = kv_transfer.get("kv_connector_extra_config") or {}
    subs = extra.get("connectors") if isinstance(extra, Mapping) else None
    if name:
        names.append(str(name))
    if isinstance(subs, list):
        for sub in subs:
            if isinstance(sub, Mapping):
                names.extend(connector_names(sub))
    return names


def connector_entries(kv_transfer: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """Each configured connector with its own extra config: MultiConnector's children (under
    its extra config's ``connectors``), else the one connector; as vLLM's
    ``hisparse_host_pool_gib`` walks them."""
    if not kv_transfer:
        return []
    extra = kv_transfer.get("kv_connector_extra_config") or {}
    if kv_transfer.get("kv_connector") == "MultiConnector" and isinstance(extra, Mapping):
        subs = extra.get("connectors")
        return [c for c in subs if isinstance(c, Mapping)] if isinstance(subs, list) else []
    return [kv_transfer]


def _extra_of(entries: list[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    for entry in entries:
        if entry.get("kv_connector") == name:
            extra = entry.get("kv_connector_extra_config")
            return extra if isinstance(extra, Mapping) else {}
    return None


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def select_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that change how an engine fails, secrets masked."""
    picked = {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return dict(sorted(redact(picked).items()))


def build_fingerprint(
    vllm_config: Any,
    *,
    engine_index: int,
    vllm_version: str,
    environ: Mapping[str, str],
    hostname: str,
    pid: int,
) -> dict[str, Any]:
    model = _get(vllm_config, "model_config")
    parallel = _get(vllm_config, "parallel_config")
    cache = _get(vllm_config, "cache_config")
    sched = _get(vllm_config, "scheduler_config")
    comp = _get(vllm_config, "compilation_config")
    kvt_obj = _get(vllm_config, "kv_transfer_config")
    kvt = as_plain(kvt_obj) if kvt_obj is not None else None
    if kvt is not None and not isinstance(kvt, dict):
        kvt = {"value": kvt}
    entries = connector_entries(kvt)
    hisparse_extra = _extra_of(entries, "HiSparseConnector")
    pool_gib = _float_or_none(hisparse_extra.get("host_pool_gib")) if hisparse_extra is not None else None
    nixl_extra = _extra_of(entries, "NixlConnector")
    nixl = None if nixl_extra is None else redact({k: as_plain(nixl_extra[k]) for k in NIXL_KEYS if k in nixl_extra})
    offload_extra = _extra_of(entries, "OffloadingConnector")
    hs_cfg = _get(vllm_config, "attention_config", "hisparse_config")
    hisparse = None
    if hs_cfg is not None:
        hisparse = {"eager_host_mirror": _get(hs_cfg, "eager_host_mirror"), "device_buffer_size": _get(hs_cfg, "device_buffer_size")}
    served = _get(model, "served_model_name")
    if isinstance(served, (list, tuple)):
        served = served[0] if len(served) == 1 else list(served)
    scheduler_cls = _get(sched, "scheduler_cls")
    if scheduler_cls is not None and not isinstance(scheduler_cls, str):
        scheduler_cls = f"{getattr(scheduler_cls, '__module__', '')}.{getattr(scheduler_cls, '__qualname__', scheduler_cls)}"
    facts: dict[str, Any] = {
        "vllm_version": vllm_version,
        "model": _get(model, "model"),
        "served_model_name": served,
        "tensor_parallel_size": _get(parallel, "tensor_parallel_size"),
        "pipeline_parallel_size": _get(parallel, "pipeline_parallel_size"),
        "data_parallel_size": _get(parallel, "data_parallel_size"),
        "engine_index": engine_index,
        "block_size": _get(cache, "block_size"),
        "kv_transfer_config": redact(kvt) if kvt is not None else None,
        "connectors": connector_names(kvt),
        "kv_role": (kvt or {}).get("kv_role"),
        "kv_buffer_device": (kvt or {}).get("kv_buffer_device"),
        "host_pool_gib": pool_gib,
        "host_pool_size": None if pool_gib is None else int(pool_gib * GIB),
        "hisparse": hisparse,
        "nixl": nixl,
        "offload_cpu_bytes": (offload_extra or {}).get("cpu_bytes_to_use"),
        "cuda_graph_mode": _enum_name(_get(comp, "cudagraph_mode")),
        "compilation_mode": _enum_name(_get(comp, "mode")),
        "enforce_eager": _get(model, "enforce_eager"),
        "max_num_seqs": _get(sched, "max_num_seqs"),
        "max_model_len": _get(model, "max_model_len"),
        "dtype": as_plain(_get(model, "dtype")),
        "kv_cache_dtype": as_plain(_get(cache, "cache_dtype")),
        "enable_prefix_caching": _get(cache, "enable_prefix_caching"),
        "async_scheduling": _get(sched, "async_scheduling"),
        "scheduler_cls": scheduler_cls,
        "model_runner": _model_runner(vllm_config, vllm_version),
        "device": as_plain(_get(vllm_config, "device_config", "device_type")),
        "env": select_env(environ),
        "hostname": hostname,
        "pid": pid,
    }
    return facts


def _model_runner(vllm_config: Any, vllm_version: str = "unknown") -> str | None:
    """``v2`` or ``v1``: the GPU model runner vLLM picks (``VllmConfig.use_v2_model_runner``, 0.2x
    to 0.32; the V2 runner reports no per-step CUDA graph), None where this vLLM has no choice.
    vLLM 0.34 removed the V1 runner and the property with it: there it is always ``v2``."""
    if as_plain(_get(vllm_config, "device_config", "device_type")) != "cuda":
        return None  # the CPU build runs its own runner, whatever the property says
    try:
        v2 = getattr(vllm_config, "use_v2_model_runner", None)
    except Exception:  # noqa: BLE001 - a property of vLLM's: never let it stop the fingerprint
        return None
    if isinstance(v2, bool):
        return "v2" if v2 else "v1"
    release = re.match(r"^v?(\d+)\.(\d+)", vllm_version)
    if v2 is None and release is not None and (int(release.group(1)), int(release.group(2))) >= V1_RUNNER_REMOVED:
        return "v2"
    return None


def fingerprint_facts(vllm_config: Any, identity: EngineIdentity) -> dict[str, Any]:
    """The fingerprint of the engine this process records, with the joining facts of
    ``identity`` (server pid, host, port)."""
    facts = build_fingerprint(
        vllm_config,
        engine_index=identity.engine_index,
        vllm_version=identity.engine_version,
        environ=os.environ,
        hostname=socket.gethostname(),
        pid=os.getpid(),
    )
    facts.update(identity.facts())
    return facts
