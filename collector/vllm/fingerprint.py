"""The deployment fingerprint of one engine, read from vLLM's config: the facts a crash triage
checklist asks for. Duck-typed over ``VllmConfig`` (every field read with a default), so it is
tested without vLLM and survives fields that move between vLLM versions.

Keys: vllm_version, model, served_model_name, tensor_parallel_size, pipeline_parallel_size,
data_parallel_size, engine_index, block_size, kv_transfer_config, connectors, kv_role,
host_pool_size, import_prefix_via_host, cuda_graph_mode, compilation_mode, enforce_eager,
max_num_seqs, max_model_len, env, hostname, pid; and, where known, dtype, kv_cache_dtype,
enable_prefix_caching, async_scheduling, scheduler_cls, device.
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
# Keys of a connector's extra config that give the pinned host pool's size, or say whether
# prefixes are imported through the host path. Matched on the key name, as configured.
_HOST_POOL_KEY = re.compile(r"(host|cpu|pinned)\w*(pool|buffer|mem)\w*(size|bytes|gb|gib|mb|mib)", re.I)
_IMPORT_VIA_HOST_KEY = re.compile(r"(import.*(host|cpu))|((host|cpu).*import)|(prefix.*via.*host)", re.I)


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


def _find_key(cfg: Any, pattern: re.Pattern[str], depth: int = 0) -> tuple[bool, Any]:
    if depth > 6:
        return False, None
    if isinstance(cfg, Mapping):
        for k, v in cfg.items():
            if not isinstance(v, (Mapping, list)) and pattern.search(str(k)):
                return True, v
        for v in cfg.values():
            found, value = _find_key(v, pattern, depth + 1)
            if found:
                return True, value
    elif isinstance(cfg, list):
        for v in cfg:
            found, value = _find_key(v, pattern, depth + 1)
            if found:
                return True, value
    return False, None


def select_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that change how an engine fails, secrets masked."""
    picked = {
        k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)
    }
    return dict(sorted(redact(picked).items()))


def _bool_or_none(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


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
    extra = (kvt or {}).get("kv_connector_extra_config") or {}
    found_pool, pool = _find_key(extra, _HOST_POOL_KEY)
    found_import, via_host = _find_key(extra, _IMPORT_VIA_HOST_KEY)
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
        "host_pool_size": redact(pool) if found_pool else None,
        "import_prefix_via_host": _bool_or_none(via_host) if found_import else None,
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
        "device": as_plain(_get(vllm_config, "device_config", "device_type")),
        "env": select_env(environ),
        "hostname": hostname,
        "pid": pid,
    }
    return facts


def fingerprint_facts(vllm_config: Any, identity: EngineIdentity) -> dict[str, Any]:
    """The fingerprint of the engine this process records, with the joining facts of
    ``identity`` (server pid, host, port)."""
    facts = build_fingerprint(
        vllm_config, engine_index=identity.engine_index, vllm_version=identity.engine_version,
        environ=os.environ, hostname=socket.gethostname(), pid=os.getpid(),
    )  # fmt: skip
    facts.update(identity.facts())
    return facts
