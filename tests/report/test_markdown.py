"""The report's environment section does not trust one NVML sample."""

from __future__ import annotations

from collector.report.markdown import _environment


def test_a_gpus_memory_is_what_most_samples_say_and_a_disagreeing_sample_is_named() -> None:
    one = {"gpu": "GPU-a", "index": 1, "name": "NVIDIA H200", "bus_id": "00000000:00:06.0"}
    samples = [dict(one, memory_total=80 * 2**30)] + [dict(one, memory_total=141 * 2**30) for _ in range(5)]
    [line] = [ln for ln in _environment({"gpu_samples": samples}, {}) if ln.startswith("  GPU 1")]
    assert "141 GiB (1 of 6 samples said otherwise: 80 GiB) memory" in line
    [line] = [ln for ln in _environment({"gpu_samples": samples[1:]}, {}) if ln.startswith("  GPU 1")]
    assert line.endswith("141 GiB memory")
