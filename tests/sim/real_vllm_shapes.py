"""Run with vLLM's Python: the shapes of what a real engine reports, from vLLM's own classes,
as JSON on stdout: ``KVTransferConfig`` as the recorder dumps it (MultiConnector over NIXL and
HiSparse with ``host_pool_gib``), vLLM's own reading of the host pool, ``HiSparseConfig``, the
stats keys of ``HiSparseKVConnectorStats`` and ``NixlKVConnectorStats``, and the names of
``CUDAGraphMode`` and ``CompilationMode``."""

from __future__ import annotations

import dataclasses
import json

from vllm.config.attention import HiSparseConfig
from vllm.config.compilation import CompilationMode, CUDAGraphMode
from vllm.config.kv_transfer import KVTransferConfig, hisparse_host_pool_gib
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats import HiSparseKVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

from collector.vllm.fingerprint import as_plain


def main() -> None:
    role = "kv_consumer"
    kvt = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role=role,
        kv_connector_extra_config={
            "connectors": [
                {"kv_connector": "NixlConnector", "kv_role": role},
                {"kv_connector": "HiSparseConnector", "kv_role": role, "kv_connector_extra_config": {"host_pool_gib": 128.0}},
            ]
        },
    )
    print(
        json.dumps(
            {
                "kv_transfer_config": as_plain(kvt),
                "host_pool_gib": hisparse_host_pool_gib(kvt),
                "hisparse_config": as_plain(HiSparseConfig()),
                "hisparse_config_fields": [f.name for f in dataclasses.fields(HiSparseConfig)],
                "hisparse_stats_keys": list(HiSparseKVConnectorStats().data),
                "nixl_stats_keys": list(NixlKVConnectorStats().data),
                "cudagraph_modes": list(CUDAGraphMode.__members__),
                "compilation_modes": list(CompilationMode.__members__),
            }
        )
    )


if __name__ == "__main__":
    main()
