"""One label scheme for everything this project exports: the sidecar's /metrics, the alerts
it sends, and the alerts the shipped Prometheus rules send. The same fault carries the same
labels from both senders, so Alertmanager deduplicates, groups and inhibits across them.

GPU labels follow NVIDIA's dcgm-exporter, so our series join theirs (``on (UUID)``,
``on (Hostname, gpu)``)::

    gpu="1"  UUID="GPU-5c1e..."  pci_bus_id="00000000:06:00.0"  modelName="NVIDIA H200"
    Hostname="node-a"

``engine`` is the sidecar's name for an engine (``engines[].name``); vLLM's own ``engine``
label (the DP engine index) is mapped onto it by the Prometheus scrape config's
``flightrec_engine`` target label (rules/flightrec-alerts.yml, docs/alerting.md).

Every label is a string; an unknown value is the empty string, which Prometheus and
Alertmanager treat as an absent label (never a made-up "0").
"""

from __future__ import annotations

from collections.abc import Iterable

from collector.model import GpuSample
from collector.xid.parser import XidParseError, normalize_bus_id

HOSTNAME = "Hostname"
ENGINE = "engine"
GPU_INDEX = "gpu"
GPU_UUID = "UUID"
GPU_BUS = "pci_bus_id"
GPU_MODEL = "modelName"

# The GPU labels an alert carries (modelName is a property, not an identity: annotations).
ALERT_GPU_LABELS = (GPU_INDEX, GPU_UUID, GPU_BUS)
METRIC_GPU_LABELS = (GPU_INDEX, GPU_UUID, GPU_BUS, GPU_MODEL)


def dcgm_bus_id(bus_id: str | None) -> str:
    """NVML's and dcgm-exporter's form, ``00000000:06:00.0``, from any form we hold."""
    if not bus_id:
        return ""
    try:
        canonical = normalize_bus_id(bus_id)
    except XidParseError:
        return ""
    domain, bus, rest = canonical.split(":")
    dev, fn = rest.split(".")
    return f"{int(domain, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


def find_gpu(key: str | None, gpus: Iterable[GpuSample]) -> GpuSample | None:
    """The GPU a key names: our key (UUID, or gpu<index>), or a PCI bus id in any form."""
    if not key:
        return None
    wanted = dcgm_bus_id(key) if ":" in key else ""
    for s in gpus:
        if key == s.gpu or (wanted and dcgm_bus_id(s.bus_id) == wanted):
            return s
    return None


def gpu_labels(key: str | None, gpus: Iterable[GpuSample], *, names: tuple[str, ...] = METRIC_GPU_LABELS) -> dict[str, str]:
    """dcgm-exporter's labels for the GPU ``key`` names (``names`` picks which)."""
    s = find_gpu(key, gpus)
    if s is not None:
        values = {
            GPU_INDEX: str(s.index),
            GPU_UUID: s.gpu if s.gpu.startswith("GPU-") else "",
            GPU_BUS: dcgm_bus_id(s.bus_id),
            GPU_MODEL: s.name or "",
        }
    else:  # a GPU NVML never listed (no NVML here): keep what the key itself says
        key = key or ""
        values = {
            GPU_INDEX: key[3:] if key.startswith("gpu") and key[3:].isdigit() else "",
            GPU_UUID: key if key.startswith("GPU-") else "",
            GPU_BUS: dcgm_bus_id(key) if ":" in key else "",
            GPU_MODEL: "",
        }
    return {n: values[n] for n in names}
