"""GPU samples from a dcgm-exporter ``/metrics`` page, where an SRE already runs dcgm-exporter
and will not run a second NVML poller on the node.

dcgm-exporter names each GPU by the labels ``gpu`` (index), ``UUID``, ``pci_bus_id``
(``00000000:31:00.0``), ``device`` (``nvidia0``), ``modelName`` and ``Hostname`` (and, with
Kubernetes mapping, ``namespace``/``pod``/``container`` of the pod using it). The fields read,
in the default counters' names (``etc/default-counters.csv``) where it has them:

============================================  =========================================
dcgm-exporter                                 ``GpuSample``
============================================  =========================================
``DCGM_FI_DEV_FB_USED`` (MiB)                 ``memory_used`` (bytes)
``DCGM_FI_DEV_FB_TOTAL``, else USED+FREE(+RESERVED)  ``memory_total`` (bytes)
``DCGM_FI_DEV_GPU_UTIL`` (%)                  ``utilization``
``DCGM_FI_DEV_MEM_COPY_UTIL`` (%)             ``memory_utilization``
``DCGM_FI_DEV_GPU_TEMP`` (C)                  ``temperature``
``DCGM_FI_DEV_POWER_USAGE`` (W)               ``power_w``
``DCGM_FI_DEV_SM_CLOCK`` (MHz)                ``sm_clock_mhz``
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (or the older ``..._CLOCK_THROTTLE_REASONS``)  ``clock_event_reasons``
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` / ``_SBE_``  ``ecc_volatile_uncorrected`` / ``_corrected``
``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`` / ``CORRECTABLE_``  ``remapped_rows_*``
``DCGM_FI_DEV_ROW_REMAP_PENDING``             ``remapped_rows_pending``
``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``           ``pcie_replay``
============================================  =========================================

A field the page does not carry stays None (unknown, never 0): the default counters have no
ECC and no clock reasons. DCGM's "blank" values (a field the GPU does not support, served as
huge sentinels such as 9223372036854775794 or 2147483632) are None too. ``DCGM_FI_DEV_XID_ERRORS``
(the last Xid's number, sticky) is not read: Xids come from NVML's events and the kernel log.
Per-process memory is not in dcgm-exporter's page: ``processes`` stays empty. Which pod uses a
GPU is, where dcgm-exporter maps GPUs to pods (its Kubernetes mode, the GPU Operator's
default): ``parse_page`` gives ``pods``, GPU index -> (namespace, pod).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collector.model import GpuSample
from collector.parsers.prom_text import Wanted, parse
from collector.xid.parser import XidParseError, normalize_bus_id

PREFIX = "DCGM_FI_DEV_"
WANTED = Wanted(samples=(), prefixes=(PREFIX,))
MIB = 1024 * 1024
# DCGM_INT32_BLANK (0x7ffffff0) and everything above it: DCGM's "no value" sentinels (the int64
# ones and DCGM_FP64_BLANK, 140737488355328.0, included)
_BLANK = 0x7FFFFFF0


def _value(v: float) -> float | None:
    return None if math.isnan(v) or math.isinf(v) or v >= _BLANK else v


@dataclass(frozen=True, slots=True)
class DcgmPage:
    samples: list[GpuSample]
    pods: dict[int, tuple[str, str]]  # GPU index -> (namespace, pod) using it


def gpu_samples(text: str, ts: float) -> list[GpuSample]:
    """One sample per GPU on the page (by ``gpu`` index), in index order. Raises
    ``MetricsParseError`` on a page that is not exposition text (``prom_text.parse``)."""
    return parse_page(text, ts).samples


def parse_page(text: str, ts: float) -> DcgmPage:
    """The page's GPU samples and which pod uses each GPU (where the page says)."""
    page = parse(text, WANTED)
    pods: dict[int, tuple[str, str]] = {}
    fields: dict[int, dict[str, float | None]] = {}
    labels: dict[int, dict[str, str]] = {}
    for s in page.samples:
        index_label = s.labels.get("gpu", "")
        if not index_label.isascii() or not index_label.isdigit():
            continue  # a MIG instance's or a switch's series: not a GPU row
        index = int(index_label)
        if s.labels.get("GPU_I_ID"):  # a MIG instance of that GPU: the GPU's own series are enough
            continue
        fields.setdefault(index, {})[s.name[len(PREFIX) :]] = _value(s.value)
        labels.setdefault(index, s.labels)
        if s.labels.get("pod") and s.labels.get("namespace"):
            pods[index] = (s.labels["namespace"], s.labels["pod"])
    out = []
    for index in sorted(fields):
        f, lab = fields[index], labels[index]
        uuid = lab.get("UUID") or f"gpu{index}"
        try:
            bus_id = normalize_bus_id(lab["pci_bus_id"]) if lab.get("pci_bus_id") else None
        except XidParseError:
            bus_id = None
        used = f.get("FB_USED")
        total = f.get("FB_TOTAL")
        if total is None and used is not None and f.get("FB_FREE") is not None:
            total = used + (f.get("FB_FREE") or 0.0) + (f.get("FB_RESERVED") or 0.0)
        reasons = f.get("CLOCKS_EVENT_REASONS", f.get("CLOCK_THROTTLE_REASONS"))
        pending = f.get("ROW_REMAP_PENDING")
        out.append(
            GpuSample(
                gpu=uuid,
                index=index,
                ts=ts,
                bus_id=bus_id,
                name=lab.get("modelName"),
                memory_used=_int(used, MIB),
                memory_total=_int(total, MIB),
                utilization=f.get("GPU_UTIL"),
                memory_utilization=f.get("MEM_COPY_UTIL"),
                temperature=f.get("GPU_TEMP"),
                power_w=f.get("POWER_USAGE"),
                sm_clock_mhz=f.get("SM_CLOCK"),
                clock_event_reasons=_int(reasons),
                ecc_volatile_uncorrected=_int(f.get("ECC_DBE_VOL_TOTAL")),
                ecc_volatile_corrected=_int(f.get("ECC_SBE_VOL_TOTAL")),
                remapped_rows_correctable=_int(f.get("CORRECTABLE_REMAPPED_ROWS")),
                remapped_rows_uncorrectable=_int(f.get("UNCORRECTABLE_REMAPPED_ROWS")),
                remapped_rows_pending=None if pending is None else pending > 0,
                pcie_replay=_int(f.get("PCIE_REPLAY_COUNTER")),
            )
        )
    return DcgmPage(out, pods)


def _int(v: float | None, scale: int = 1) -> int | None:
    return None if v is None else int(round(v * scale))
