"""Model shapes for the GPU cost phase (Llama-shaped, dummy weights, no tokenizer) and the
memory each of two servers sharing one GPU gets."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from gpu_tier_lib import LLAMA_1B, LLAMA_TINY

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": LLAMA_TINY,
    "1b": LLAMA_1B,
    "8b": {
        **LLAMA_1B,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "14b": {
        **LLAMA_1B,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
}


def params(cfg: dict[str, Any]) -> int:
    """Parameters of a Llama shape (untied embeddings, norms left out: under 0.01%)."""
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return 2 * v * h + L * (h * q + 2 * h * kv + q * h + 3 * h * i)


def kv_bytes_per_token(cfg: dict[str, Any]) -> int:
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 2  # K and V, bf16


def gpu_total_gib(gpu_line: str) -> float | None:
    """GPU memory from ``nvidia-smi --query-gpu=name,driver_version,memory.total,...`` (MiB)."""
    m = re.search(r",\s*(\d+)\s*MiB", gpu_line or "")
    return int(m.group(1)) / 1024 if m else None


def plan_memory(shape: str, total_gib: float | None, smoke: bool) -> dict[str, Any]:
    """The shape (``auto`` resolved by the GPU's memory) and each server's memory: two servers
    share the GPU, each with ``gpu_util`` of it (vLLM's start-up check) and an explicit KV cache
    (vLLM's profiling of two engines starting together on one GPU would each see the other's
    allocations): the KV cache is what is left of that share after the weights and 6 GiB for
    activations, CUDA graphs and the CUDA context, at most 24 GiB."""
    if smoke:
        cfg = SHAPES["tiny"]
        return {"shape": "tiny", "config": cfg, "params_b": round(params(cfg) / 1e9, 4), "gpu_util": 0.25, "kv_bytes": 64 * 1024**2, "why": "smoke"}
    why = f"--shape {shape}"
    if shape == "auto":
        if total_gib is None:
            raise RuntimeError("--shape auto needs the GPU's memory (nvidia-smi gave none)")
        shape = "14b" if total_gib >= 120 else "8b"
        why = f"auto: {total_gib:.0f} GiB GPU memory -> {shape} (14b from 120 GiB: two copies with their KV caches; a 32B does not fit twice)"
    cfg = SHAPES[shape]
    n_params = params(cfg)
    if shape == "1b":  # the earlier runs' memory, unchanged
        return {"shape": shape, "config": cfg, "params_b": round(n_params / 1e9, 3), "gpu_util": 0.25, "kv_bytes": 16 * 1024**3, "why": why}
    util = 0.45
    weights_gib = n_params * 2 / 1024**3
    budget = (total_gib or 80.0) * util
    kv_gib = min(24.0, budget - weights_gib - 6.0)
    if kv_gib < 4.0:
        raise RuntimeError(f"shape {shape} ({weights_gib:.1f} GiB of weights) leaves {kv_gib:.1f} GiB of KV cache in {budget:.1f} GiB: too little")
    return {
        "shape": shape,
        "config": cfg,
        "params_b": round(n_params / 1e9, 3),
        "weights_gib": round(weights_gib, 2),
        "gpu_util": util,
        "kv_bytes": int(kv_gib * 1024**3),
        "why": why,
    }


def capacity_concurrency(kv_bytes: int, cfg: dict[str, Any], isl: int, osl: int, most: int = 256) -> int:
    """Concurrency of the capacity loop: what 90% of the KV cache holds at full length (no
    preemption), at most ``most``."""
    tokens = kv_bytes // kv_bytes_per_token(cfg)
    return max(1, min(most, int(0.9 * tokens / (isl + osl))))


def nvidia_smi() -> str:
    """The GPU's name, driver, memory (MiB) and bus id; the error where there is none."""
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return repr(exc)
