"""GPU samples from dcgm-exporter pages: a page captured on a GPU Operator cluster
(tests/fixtures/dcgm-exporter, with its provenance), what the default counters lack staying
unknown, DCGM's blank sentinels, MIG rows, garbage."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.parsers.dcgm import gpu_samples, parse_page
from collector.parsers.prom_text import MetricsParseError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"
L4 = (FIXTURES / "l4-gpu-operator.txt").read_text()
UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"


def test_the_captured_page() -> None:
    [s] = gpu_samples(L4, 1000.0)
    assert (s.gpu, s.index, s.ts, s.bus_id, s.name) == (UUID, 0, 1000.0, "0000:31:00.0", "NVIDIA L4")
    assert s.temperature == 31 and s.power_w == pytest.approx(16.365) and s.sm_clock_mhz == 210
    assert s.utilization == 0 and s.memory_utilization == 0
    # MiB -> bytes; total = used + free + reserved when FB_TOTAL is not exported
    assert s.memory_used == 0 and s.memory_total == (0 + 22563 + 470) * 1024 * 1024
    assert s.remapped_rows_correctable == 0 and s.remapped_rows_uncorrectable == 0 and s.pcie_replay == 0
    # the default counters export no ECC, clock reasons or pending remaps: unknown, not 0
    assert s.ecc_volatile_uncorrected is None and s.ecc_volatile_corrected is None
    assert s.clock_event_reasons is None and s.remapped_rows_pending is None
    assert s.processes == []


def test_every_default_counter_named_in_the_csv_is_a_dcgm_field_we_know_or_skip() -> None:
    """The fields read are the ones dcgm-exporter's default counters CSV exports (or opt-in ones)."""
    csv = (FIXTURES / "default-counters.csv").read_text()
    exported = {ln.split(",")[0].strip().lstrip("# ").strip() for ln in csv.splitlines() if ln.strip().startswith(("DCGM_", "# DCGM_"))}
    for name in ("GPU_TEMP", "POWER_USAGE", "SM_CLOCK", "GPU_UTIL", "MEM_COPY_UTIL", "FB_USED", "FB_FREE", "PCIE_REPLAY_COUNTER"):
        assert f"DCGM_FI_DEV_{name}" in exported, name
    for name in ("CORRECTABLE_REMAPPED_ROWS", "UNCORRECTABLE_REMAPPED_ROWS", "ECC_DBE_VOL_TOTAL", "ECC_SBE_VOL_TOTAL", "XID_ERRORS"):
        assert f"DCGM_FI_DEV_{name}" in exported, name


def h200_page() -> str:
    """The captured page turned into two H200s with the opt-in fields an SRE may add."""
    lines = []
    for gpu, bus, uuid in ((0, "00000000:18:00.0", "GPU-aaaa"), (1, "00000000:2A:00.0", "GPU-bbbb")):
        lab = f'{{gpu="{gpu}",UUID="{uuid}",pci_bus_id="{bus}",device="nvidia{gpu}",modelName="NVIDIA H200",Hostname="gpu-node-a"}}'
        lines += [
            f"DCGM_FI_DEV_GPU_TEMP{lab} {40 + gpu}",
            f"DCGM_FI_DEV_FB_USED{lab} 1024",
            f"DCGM_FI_DEV_FB_FREE{lab} 142000",
            f"DCGM_FI_DEV_FB_TOTAL{lab} 143771",
            f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{lab} {gpu * 2}",
            f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{lab} 9",
            f"DCGM_FI_DEV_ROW_REMAP_PENDING{lab} {gpu}",
            f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{lab} 4",
            f"DCGM_FI_DEV_XID_ERRORS{lab} 43",
            # unsupported on this GPU: DCGM's blank
            f"DCGM_FI_DEV_POWER_USAGE{lab} 9223372036854775794",
        ]
    # a MIG instance's series (GPU_I_ID) and a series without a gpu index are no GPU rows
    lines.append('DCGM_FI_DEV_GPU_TEMP{gpu="0",GPU_I_ID="1",UUID="GPU-aaaa"} 99')
    lines.append('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-x"} 99')
    return "\n".join(lines) + "\n"


def test_opt_in_fields_blanks_and_mig_rows() -> None:
    a, b = gpu_samples(h200_page(), 5.0)
    assert (a.index, a.bus_id, b.bus_id) == (0, "0000:18:00.0", "0000:2a:00.0")
    assert a.temperature == 40 and b.temperature == 41  # the MIG row did not overwrite GPU 0
    assert a.memory_total == 143771 * 1024 * 1024
    assert (a.ecc_volatile_uncorrected, b.ecc_volatile_uncorrected, a.ecc_volatile_corrected) == (0, 2, 9)
    assert (a.remapped_rows_pending, b.remapped_rows_pending) == (False, True)
    assert a.clock_event_reasons == 4
    assert a.power_w is None  # blank, not 9.2e18 W


def test_not_a_page() -> None:
    with pytest.raises(MetricsParseError):
        gpu_samples('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 31', 0.0)  # cut: no final newline
    with pytest.raises(MetricsParseError):
        gpu_samples('DCGM_FI_DEV_GPU_TEMP{gpu="0" 31\n', 0.0)
    assert gpu_samples("# HELP x\n", 0.0) == []


@given(st.text(max_size=300))
def test_garbage_is_an_error_or_nothing(text: str) -> None:
    try:
        gpu_samples(text, 0.0)
    except MetricsParseError:
        pass


def test_which_pod_uses_each_gpu() -> None:
    """dcgm-exporter's Kubernetes mode labels a GPU's series with the pod using it; these lines
    are from a page published from an EKS node (NVIDIA L40S, a vLLM pod on GPU 0)."""
    page = (
        'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1c2b08c1-f602-d290-4519-863bc0c96079",pci_bus_id="00000000:30:00.0",device="nvidia0",'
        'modelName="NVIDIA L40S",Hostname="i-0e2c27f8b63f89296",container="vllm",namespace="default",pod="mistral-6cfb59d6cd-xbwgd"} 2520\n'
        'DCGM_FI_DEV_MEM_CLOCK{gpu="0",UUID="GPU-1c2b08c1-f602-d290-4519-863bc0c96079",pci_bus_id="00000000:30:00.0",device="nvidia0",'
        'modelName="NVIDIA L40S",Hostname="i-0e2c27f8b63f89296",container="vllm",namespace="default",pod="mistral-6cfb59d6cd-xbwgd"} 9001\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-2",pci_bus_id="00000000:31:00.0",device="nvidia1",modelName="NVIDIA L40S"} 210\n'
    )
    parsed = parse_page(page, 0.0)
    assert parsed.pods == {0: ("default", "mistral-6cfb59d6cd-xbwgd")}  # GPU 1: no pod
    assert [s.sm_clock_mhz for s in parsed.samples] == [2520, 210]
    assert parse_page(L4, 0.0).pods == {}  # the captured page: no pod mapping
