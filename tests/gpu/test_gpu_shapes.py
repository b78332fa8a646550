"""Model shapes and memory for the GPU cost phase (scripts/gpu/gpu_shapes.py): published sizes,
the shape and KV cache by GPU memory, the capacity loop's concurrency."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import gpu_shapes as ch  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 00000000:00:06.0"
H200 = "NVIDIA H200, 580.159.04, 143771 MiB, 00000000:00:06.0"


def test_shapes_have_their_published_sizes() -> None:
    assert ch.params(ch.SHAPES["1b"]) / 1e9 == pytest.approx(1.1, abs=0.05)  # TinyLlama 1.1B
    assert ch.params(ch.SHAPES["8b"]) / 1e9 == pytest.approx(8.03, abs=0.01)  # Llama 3 8B
    assert ch.params(ch.SHAPES["14b"]) / 1e9 == pytest.approx(14.5, abs=0.3)
    assert ch.kv_bytes_per_token(ch.SHAPES["8b"]) == 2 * 32 * 8 * 128 * 2  # 128 KiB a token


def test_gpu_memory_is_read_from_nvidia_smi() -> None:
    assert ch.gpu_total_gib(H100) == pytest.approx(79.65, abs=0.01)
    assert ch.gpu_total_gib("FileNotFoundError(2, 'No such file')") is None


def test_auto_picks_by_gpu_memory_and_leaves_room_for_two() -> None:
    h100 = ch.plan_memory("auto", ch.gpu_total_gib(H100), smoke=False)
    h200 = ch.plan_memory("auto", ch.gpu_total_gib(H200), smoke=False)
    assert h100["shape"] == "8b" and h200["shape"] == "14b"
    for plan, line in ((h100, H100), (h200, H200)):
        total = (ch.gpu_total_gib(line) or 0) * 1024**3
        per_server = plan["weights_gib"] * 1024**3 + plan["kv_bytes"] + 6 * 1024**3
        assert per_server <= plan["gpu_util"] * total + 0.01 * 1024**3  # weights_gib is rounded
        assert 2 * plan["gpu_util"] <= 0.92
        assert plan["kv_bytes"] >= 10 * 1024**3
        assert "auto" in plan["why"]


def test_a_shape_too_big_for_its_share_is_refused() -> None:
    with pytest.raises(RuntimeError, match="too little"):
        ch.plan_memory("14b", ch.gpu_total_gib(H100), smoke=False)
    with pytest.raises(RuntimeError, match="memory"):
        ch.plan_memory("auto", None, smoke=False)


def test_the_earlier_runs_memory_for_1b_and_a_tiny_model_for_smoke() -> None:
    assert ch.plan_memory("1b", None, smoke=False)["kv_bytes"] == 16 * 1024**3
    assert ch.plan_memory("8b", None, smoke=True)["shape"] == "tiny"


def test_capacity_concurrency_is_what_the_cache_holds() -> None:
    cfg = ch.SHAPES["8b"]
    kv = 14 * 1024**3
    c = ch.capacity_concurrency(kv, cfg, 512, 128)
    assert c == int(0.9 * kv // ch.kv_bytes_per_token(cfg) / 640)
    assert ch.capacity_concurrency(16 * 1024**3, ch.SHAPES["1b"], 512, 128) == 256  # capped
