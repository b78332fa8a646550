"""The crash signature: what makes two snapshots the same crash, wherever they were taken.

Its fields, read from the snapshot (the trigger, the events it holds, the fingerprint):

- ``xid``: the Xid codes the GPU raised (sorted), e.g. ``[43]``;
- ``cuda_error``: the CUDA error kind, from ``CUDA error: <kind>`` in the workers' errors,
  lower-cased (``unspecified launch failure``);
- ``exception``: the exception type those lines name (``torch.AcceleratorError``);
- ``frames``: each failing worker's top frames (the innermost ``FRAMES``), normalised to
  ``vllm/<path>:<function>``: no install prefix, no line numbers (they move with every build of
  one version; the version is its own field), sorted and deduplicated across workers;
- ``vllm_version``, ``model``, ``connector`` (the KV connectors, joined).

Where the fault happened (host, GPU) is not in it: that is what the fleet view groups by. A
hardware fault follows the GPU (one GPU, again and again, whatever runs on it); a software
fault recurs on different GPUs and hosts with the same frames. So a hardware fault's id is
made of its Xid codes alone: the model, version and frames of whatever ran on the GPU when it
failed say nothing about the fault, and would split one bad GPU's faults into as many groups
as workloads it ran (the fields are still kept and shown). ``fault_class`` is the
snapshot's own hint before any grouping: ``hardware`` when an Xid of the catalog's hardware,
memory or NVLink categories is present, ``software`` when the fault is a CUDA error or an
application-category Xid, else ``unknown``.

The id is the first 16 hex digits of a SHA-256 over the fields' canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from collector.xid.catalog import lookup as xid_info

FRAMES = 3
HARDWARE_CATEGORIES = frozenset({"hardware", "memory", "nvlink", "thermal"})
# ``torch.AcceleratorError: CUDA error: unspecified launch failure``
# ``RuntimeError: CUDA error: an illegal memory access was encountered``
_CUDA = re.compile(r"CUDA error: ([^\n.;]+)")
# ``torch.AcceleratorError: CUDA error: ...`` -> torch.AcceleratorError
_EXC = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception))\b")
# ``/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/model_runner.py`` -> vllm/v1/worker/gpu/model_runner.py
_PKG = re.compile(r"(?:^|/)((?:vllm|torch|collector|nixl\w*|flashinfer|triton)/.*)$")
_ERROR_KINDS = frozenset({"cuda_error", "engine_fatal", "nccl_error"})


@dataclass(frozen=True)
class Signature:
    xid: list[int] = field(default_factory=list)
    cuda_error: str | None = None
    exception: str | None = None
    frames: list[str] = field(default_factory=list)
    vllm_version: str | None = None
    model: str | None = None
    connector: str | None = None

    @property
    def id(self) -> str:
        fields = {"xid": self.xid, "class": "hardware"} if self.fault_class == "hardware" else asdict(self)
        canon = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @property
    def fault_class(self) -> str:
        cats = {xid_info(code).category for code in self.xid}
        if cats & HARDWARE_CATEGORIES:
            return "hardware"
        if self.cuda_error or self.exception or "application" in cats:
            return "software"
        return "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "id": self.id, "fault_class": self.fault_class}

    def merged(self, other: Signature) -> Signature:
        """The signature of both sets of evidence together: what ``compute`` gives over the
        union of the two snapshots' events (Xids and frames joined, the smallest CUDA error and
        exception kept), so late evidence amends a stored signature without its first events."""

        def least(a: str | None, b: str | None) -> str | None:
            return min(x for x in (a, b) if x) if (a or b) else None

        return Signature(
            xid=sorted(set(self.xid) | set(other.xid)),
            cuda_error=least(self.cuda_error, other.cuda_error),
            exception=least(self.exception, other.exception),
            frames=sorted(set(self.frames) | set(other.frames)),
            vllm_version=self.vllm_version or other.vllm_version,
            model=self.model or other.model,
            connector=self.connector or other.connector,
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Signature:
        """A stored ``to_dict()`` (a snapshot's ``summary.signature``) back into a signature."""
        xid = [int(x) for x in raw.get("xid") or [] if isinstance(x, int) and not isinstance(x, bool)]
        return cls(
            xid=sorted(xid),
            cuda_error=_str(raw.get("cuda_error")),
            exception=_str(raw.get("exception")),
            frames=sorted(str(f) for f in raw.get("frames") or []),
            vllm_version=_str(raw.get("vllm_version")),
            model=_str(raw.get("model")),
            connector=_str(raw.get("connector")),
        )


def normalise_frame(frame: dict[str, Any]) -> str:
    path = str(frame.get("file") or "?")
    m = _PKG.search(path)
    path = m.group(1) if m else path.rsplit("/", 1)[-1]
    return f"{path}:{frame.get('func') or '?'}"


def _frames(ev: dict[str, Any]) -> list[dict[str, Any]]:
    frames = ev.get("frames") or (ev.get("data") or {}).get("frames") or []
    return [f for f in frames if isinstance(f, dict)]


def compute(trigger: dict[str, Any], events: list[dict[str, Any]], fingerprint: dict[str, Any]) -> Signature:
    """The signature of one snapshot: its trigger, the events it holds, its engine's fingerprint."""
    xids: set[int] = set()
    cuda: list[str] = []
    excs: list[str] = []
    tops: set[str] = set()
    for ev in [trigger, *events]:
        code = ev.get("xid")
        if isinstance(code, int) and not isinstance(code, bool):
            xids.add(code)
        if ev.get("kind") not in _ERROR_KINDS and ev is not trigger:
            continue
        message = str(ev.get("message") or "")
        m = _CUDA.search(message)
        if m:
            cuda.append(m.group(1).strip().lower())
        e = _EXC.match(message)
        if e and ev.get("kind") == "cuda_error":
            excs.append(e.group(1))
        frames = _frames(ev)
        if frames and ev.get("kind") == "cuda_error":
            tops.add(" < ".join(normalise_frame(f) for f in reversed(frames[-FRAMES:])))
    connectors = fingerprint.get("connectors")
    connector = ",".join(str(c) for c in connectors) if isinstance(connectors, list) and connectors else None
    if connector is None:
        kv = fingerprint.get("kv_transfer_config")
        connector = str(kv.get("kv_connector")) if isinstance(kv, dict) and kv.get("kv_connector") else None
    return Signature(
        xid=sorted(xids),
        cuda_error=min(cuda) if cuda else None,  # the same kind in every worker; min: stable if not
        exception=min(excs) if excs else None,
        frames=sorted(tops),
        vllm_version=_str(fingerprint.get("vllm_version")),
        model=_str(fingerprint.get("model") or fingerprint.get("served_model_name")),
        connector=connector,
    )


def _str(v: Any) -> str | None:
    return str(v)[:255] if v not in (None, "") else None


def gpu_of(trigger: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    """The GPU the fault names (the Xid's bus id or UUID), or None."""
    for ev in [trigger, *events]:
        if ev.get("gpu") and (ev.get("xid") is not None or ev.get("kind") in ("xid", "gpu_lost")):
            return str(ev["gpu"])[:128]
    return None


def for_snapshot(
    doc: Any, events: list[dict[str, Any]] | None = None, *, stored: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """For a ``SnapshotDoc``: the snapshot row's signature columns (``SnapshotRow``) and the
    signature's fields, which the row's summary keeps (``summary.signature``).

    ``events``: the event rows the commit links to it (the trigger and the late evidence that
    joined it: the workers' CUDA errors and tracebacks), besides the document's own; a document
    read back from the spool holds no events part. ``stored``: the signature stored before, which
    the new evidence amends (``Signature.merged``)."""
    evs = [e for e in [*(doc.events or []), *(events or [])] if isinstance(e, dict)]
    trigger = dict(doc.trigger or {})
    sig = compute(trigger, evs, dict(doc.fingerprint or {}))
    if stored:
        sig = Signature.from_dict(stored).merged(sig)
    cols = columns(sig, gpu_of(trigger, evs))
    if stored and cols["gpu"] is None:
        del cols["gpu"]  # the new evidence names no GPU: the stored one stands
    return cols, sig.to_dict()


def columns(sig: Signature, gpu: str | None) -> dict[str, Any]:
    """The snapshot row's columns the fleet view groups and filters by."""
    return {
        "signature": sig.id,
        "fault_class": sig.fault_class,
        "gpu": gpu,
        "xid": sig.xid[0] if sig.xid else None,
        "model": sig.model,
        "vllm_version": (sig.vllm_version or "")[:64] or None,
    }
