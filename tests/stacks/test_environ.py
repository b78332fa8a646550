"""The engine's NCCL/CUDA/vLLM environment from /proc/PID/environ: what is kept, what is masked,
and what differs per process."""

from __future__ import annotations

from collector.stacks import environ


def test_relevant_keeps_the_hang_variables_and_masks_secrets() -> None:
    env = environ.relevant(
        {
            "NCCL_DEBUG": "INFO",
            "NCCL_IB_HCA": "mlx5_0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "CUDA_LAUNCH_BLOCKING": "1",
            "VLLM_API_KEY": "sk-abcdefghijkl",
            "VLLM_HOST_IP": "10.0.0.5",
            "MASTER_ADDR": "10.0.0.5",
            "HF_TOKEN": "hf_Abcdefghijk123",
            "HOME": "/root",
            "PATH": "/usr/bin",
        }
    )
    assert env["NCCL_DEBUG"] == "INFO" and env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["VLLM_API_KEY"] == "***"
    assert "HF_TOKEN" not in env and "HOME" not in env and "PATH" not in env
    assert list(env) == sorted(env)


def test_values_in_a_kept_variable_are_masked_by_pattern() -> None:
    env = environ.relevant({"VLLM_DB_URL_FOR_TESTS": "postgresql://u:pw@db/x"})
    assert "pw" not in env["VLLM_DB_URL_FOR_TESTS"]


def test_split_keeps_the_engine_cores_and_what_each_process_changes() -> None:
    per = {
        10: {"NCCL_DEBUG": "INFO", "VLLM_PORT": "8000"},
        11: {"NCCL_DEBUG": "INFO", "VLLM_PORT": "8000", "CUDA_VISIBLE_DEVICES": "0"},
        12: {"NCCL_DEBUG": "WARN"},
    }
    base, diffs = environ.split(per, 11)
    assert base == per[11]
    assert diffs == {10: {"CUDA_VISIBLE_DEVICES": None}, 12: {"NCCL_DEBUG": "WARN", "VLLM_PORT": None, "CUDA_VISIBLE_DEVICES": None}}
    assert environ.split({}, None) == ({}, {})
