"""Fingerprint facts from a config shaped like vLLM 0.32's VllmConfig (the real one is covered
in test_inside_vllm.py)."""

from __future__ import annotations

import enum
from types import SimpleNamespace

from collector.vllm.fingerprint import build_fingerprint, connector_names, select_env


class Mode(enum.Enum):
    FULL_AND_PIECEWISE = 2
    VLLM_COMPILE = 3


def incident_config() -> SimpleNamespace:
    kvt = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cuda",
        "kv_connector_extra_config": {
            "connectors": [
                {
                    "kv_connector": "NixlConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"backends": ["UCX"], "num_threads": 8, "not_a_nixl_key": 1},
                },
                {"kv_connector": "HiSparseConnector", "kv_connector_extra_config": {"host_pool_gib": 128, "import_prefix_via_host": "true"}},
            ]
        },
    }
    return SimpleNamespace(
        model_config=SimpleNamespace(model="/models/m", served_model_name="m", enforce_eager=False, max_model_len=34000),
        parallel_config=SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1),
        cache_config=SimpleNamespace(block_size=64),
        scheduler_config=SimpleNamespace(max_num_seqs=16),
        compilation_config=SimpleNamespace(cudagraph_mode=Mode.FULL_AND_PIECEWISE, mode=Mode.VLLM_COMPILE),
        attention_config=SimpleNamespace(hisparse_config=SimpleNamespace(device_buffer_size=None, eager_host_mirror=True)),
        kv_transfer_config=kvt,
    )


def test_the_incident_checklist_from_the_config() -> None:
    env = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_NET_PLUGIN": "libnccl-net.so", "VLLM_API_KEY": "s3cret", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0,1"}
    facts = build_fingerprint(incident_config(), engine_index=0, vllm_version="0.33.0", environ=env, hostname="n1", pid=7)
    assert facts["connectors"] == ["MultiConnector", "NixlConnector", "HiSparseConnector"]
    assert (facts["host_pool_gib"], facts["host_pool_size"]) == (128.0, 128 * 2**30)
    assert facts["hisparse"] == {"eager_host_mirror": True, "device_buffer_size": None}
    assert facts["nixl"] == {"backends": ["UCX"], "num_threads": 8}  # vLLM's NIXL keys only
    assert facts["kv_buffer_device"] == "cuda" and facts["offload_cpu_bytes"] is None
    assert "import_prefix_via_host" not in facts  # no vLLM key says so: not invented
    assert (facts["cuda_graph_mode"], facts["compilation_mode"]) == ("FULL_AND_PIECEWISE", "VLLM_COMPILE")
    assert (facts["block_size"], facts["tensor_parallel_size"], facts["kv_role"]) == (64, 2, "kv_both")
    assert facts["env"] == {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_NET_PLUGIN": "libnccl-net.so", "VLLM_API_KEY": "***"}
    assert (facts["vllm_version"], facts["hostname"], facts["pid"], facts["max_num_seqs"]) == ("0.33.0", "n1", 7, 16)


def test_no_kv_transfer() -> None:
    cfg = incident_config()
    cfg.kv_transfer_config = None
    facts = build_fingerprint(cfg, engine_index=1, vllm_version="x", environ={}, hostname="h", pid=1)
    assert facts["connectors"] == [] and facts["host_pool_gib"] is None and facts["nixl"] is None
    assert facts["kv_transfer_config"] is None and facts["engine_index"] == 1


def test_missing_config_parts_are_none() -> None:
    facts = build_fingerprint(SimpleNamespace(), engine_index=0, vllm_version="x", environ={}, hostname="h", pid=1)
    assert facts["block_size"] is None and facts["cuda_graph_mode"] is None and facts["env"] == {}


def test_connector_names_single() -> None:
    assert connector_names({"kv_connector": "NixlConnector"}) == ["NixlConnector"]


def test_a_single_hisparse_connector_has_its_pool_at_the_top() -> None:
    cfg = incident_config()
    cfg.kv_transfer_config = {"kv_connector": "HiSparseConnector", "kv_connector_extra_config": {"host_pool_gib": "64"}}
    facts = build_fingerprint(cfg, engine_index=0, vllm_version="x", environ={}, hostname="h", pid=1)
    assert (facts["host_pool_gib"], facts["connectors"], facts["nixl"]) == (64.0, ["HiSparseConnector"], None)


def test_secrets_in_env_values_are_masked() -> None:
    env = select_env({"VLLM_HF_URL": "https://user:pw@host/x", "NCCL_DEBUG": "INFO"})
    assert env == {"NCCL_DEBUG": "INFO", "VLLM_HF_URL": "https://user:***@host/x"}


def test_the_model_runner_is_named_on_cuda_and_left_unknown_elsewhere() -> None:
    from types import SimpleNamespace

    from collector.vllm.fingerprint import _model_runner

    def config(device: str, v2: object) -> object:
        return SimpleNamespace(device_config=SimpleNamespace(device_type=device), use_v2_model_runner=v2)

    assert _model_runner(config("cuda", True)) == "v2"
    assert _model_runner(config("cuda", False)) == "v1"
    assert _model_runner(config("cpu", True)) is None  # the CPU build's runner is neither
    assert _model_runner(config("cuda", None)) is None  # a vLLM without the choice


def test_vllm_034_has_only_the_v2_runner() -> None:
    # vLLM 0.34 removed the V1 GPU model runner and VllmConfig.use_v2_model_runner with it
    # (docs/vllm-versions.md): its engines run V2, which a missing property must not hide
    from types import SimpleNamespace

    from collector.vllm.fingerprint import _model_runner

    no_property = SimpleNamespace(device_config=SimpleNamespace(device_type="cuda"))
    assert _model_runner(no_property, "0.34.0") == "v2"
    assert _model_runner(no_property, "0.35.1.dev3+gabc") == "v2"
    assert _model_runner(no_property, "0.32.0") is None  # a release that should have it: unknown
    assert _model_runner(no_property, "unknown") is None
    assert _model_runner(SimpleNamespace(device_config=SimpleNamespace(device_type="cpu")), "0.34.0") is None
