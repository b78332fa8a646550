"""The simulated engines' deployments, as vLLM's own ``VllmConfig`` holds them, and their
fingerprint as the recorder reports it.

The config is shaped like vLLM's (``model_config``, ``parallel_config``, ``cache_config``,
``scheduler_config``, ``compilation_config``, ``attention_config.hisparse_config``,
``kv_transfer_config``) with vLLM's key names and enum names, and the fingerprint is built from
it by the recorder's own ``collector.vllm.fingerprint.build_fingerprint``: a simulated engine
reports exactly what the recorder would read from a real engine configured so.

Keys as vLLM has them (``vllm/config/kv_transfer.py``, ``vllm/config/attention.py``):
- MultiConnector nests its connectors under ``kv_connector_extra_config["connectors"]``;
- the HiSparse host pool is ``host_pool_gib`` (GiB, a float) in the HiSparse connector's own
  ``kv_connector_extra_config``;
- HiSparse's ``device_buffer_size`` and ``eager_host_mirror`` are in
  ``attention_config.hisparse_config``;
- no vLLM key says "import prefixes through the host": external imports always land in host
  pages, so the fingerprint has no such fact and the simulator invents none.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any


class CUDAGraphMode(enum.Enum):  # vllm.config.compilation.CUDAGraphMode, same names
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)


class CompilationMode(enum.IntEnum):  # vllm.config.compilation.CompilationMode
    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


def kv_transfer_config(kv_role: str, host_pool_gib: float, engine_id: str) -> dict[str, Any]:
    """``KVTransferConfig`` of a P/D engine with NIXL and HiSparse under MultiConnector, as
    vLLM's dataclass dumps it (its fields in its order; ``engine_id`` is a uuid4 per engine)."""
    return {
        "kv_connector": "MultiConnector",
        "engine_id": engine_id,
        "kv_buffer_device": "cuda",
        "kv_role": kv_role,
        "kv_port": 14579,
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "NixlConnector", "kv_role": kv_role},
                {
                    "kv_connector": "HiSparseConnector",
                    "kv_role": kv_role,
                    "kv_connector_extra_config": {"host_pool_gib": host_pool_gib},
                },
            ]
        },
        "kv_connector_module_path": None,
        "enable_permute_local_kv": False,
        "kv_load_failure_policy": "fail",
    }


def vllm_config(
    *,
    model: str,
    tp: int,
    block_size: int,
    max_num_seqs: int,
    max_model_len: int,
    cudagraph_mode: CUDAGraphMode,
    kv_transfer: Mapping[str, Any] | None = None,
    device_buffer_size: int | None = None,
    eager_host_mirror: bool = True,
    async_scheduling: bool = True,
) -> SimpleNamespace:
    """A ``VllmConfig``-shaped object: the attributes the recorder reads, named as vLLM names them."""
    ns = SimpleNamespace
    return ns(
        model_config=ns(model=model, served_model_name=model, enforce_eager=False, max_model_len=max_model_len, dtype="bfloat16"),
        parallel_config=ns(tensor_parallel_size=tp, pipeline_parallel_size=1, data_parallel_size=1),
        cache_config=ns(block_size=block_size, cache_dtype="auto", enable_prefix_caching=True),
        scheduler_config=ns(max_num_seqs=max_num_seqs, async_scheduling=async_scheduling, scheduler_cls=None),
        compilation_config=ns(cudagraph_mode=cudagraph_mode, mode=CompilationMode.VLLM_COMPILE),
        attention_config=ns(hisparse_config=ns(device_buffer_size=device_buffer_size, eager_host_mirror=eager_host_mirror)),
        kv_transfer_config=dict(kv_transfer) if kv_transfer is not None else None,
        device_config=ns(device_type="cuda"),
    )


def fingerprint(
    config: Any,
    *,
    vllm_version: str,
    environ: Mapping[str, str],
    pid: int,
    port: int | None,
    hostname: str = "sim-node",
    name: str | None = None,
) -> dict[str, Any]:
    """The recorder's fingerprint of ``config``, with the joining facts its engine identity adds
    (the API server's pid, host and port; ``name`` as ``FLIGHTREC_ENGINE_NAME``), and that this
    engine is simulated (said, never hidden)."""
    from collector.vllm.fingerprint import build_fingerprint

    facts = build_fingerprint(config, engine_index=0, vllm_version=vllm_version, environ=environ, hostname=hostname, pid=pid)
    try:
        from collector.recorder import EngineIdentity
    except ImportError:  # a recorder version before the identity: the pid is its joining fact
        facts["port"] = port
    else:
        identity = EngineIdentity(server_pid=pid, server_host="127.0.0.1" if port else None, server_port=port, name=name, engine_version=vllm_version)
        facts.update(identity.facts())
    facts["simulated"] = True
    return facts


def engine_id(name: str) -> str:
    """A stable uuid4-shaped ``engine_id`` per engine name (vLLM draws one at start-up)."""
    return str(uuid.UUID(bytes=uuid.uuid5(uuid.NAMESPACE_URL, name).bytes, version=4))
