"""Pure parser of NVIDIA kernel log lines: Xid errors, fallen-off-the-bus, bus id -> UUID.

Input is one kernel log record in any of the forms the sidecar meets:

- a ``/dev/kmsg`` record, ``PRIO,SEQ,USEC,FLAGS;MESSAGE`` (optionally followed by
  continuation lines `` KEY=VALUE``, which are ignored);
- a ``dmesg`` line, ``[12345.678901] MESSAGE`` or ``[Fri Aug 30 11:43:09 2024] MESSAGE``;
- a journal/syslog line, ``Oct 01 13:00:00 host kernel: MESSAGE``;
- the bare message.

``parse_line`` returns an ``XidRecord`` (an Xid, or the fallen-off-the-bus line), a
``GpuUuidRecord`` (the driver naming the UUID of the GPU at a bus id), or ``None`` for any
other line. A line that claims to be an Xid (``NVRM: Xid``) but cannot be read raises
``XidParseError``, and nothing else ever escapes: callers count those and carry on.

Bus ids: the kernel writes ``0000:00:06`` (4-digit domain, no function), NVML
``00000000:00:06.0`` (8-digit domain, function). ``normalize_bus_id`` maps both to one
canonical form, lowercase ``DDDD:BB:DD.F`` (4-digit domain, function included), e.g.
``0000:00:06.0``: the form ``GpuSample.bus_id`` and ``Event.gpu`` carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collector.errors import InputError


class XidParseError(InputError):
    """A line that names an Xid could not be read (truncated, garbled)."""


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """The envelope of one kernel log record; only ``message`` is always known."""

    message: str
    priority: int | None = None  # syslog level (0 emerg .. 7 debug), kmsg only
    seq: int | None = None  # kmsg sequence number
    usec: int | None = None  # microseconds since boot (kmsg, or a dmesg "[s.us]" stamp)


@dataclass(frozen=True, slots=True)
class NvlinkDetail:
    """The NVLink5 extended form (Xid 144-150): unit, fatality, and the four status words."""

    unit: str  # e.g. "RLW_REMAP", "NETIR_LINK_EVT/NETIR_LINK_DOWN"
    fatal: bool
    xc: int
    instance: int
    link: int
    words: tuple[int, ...]  # (intrinfo, errorstatus, ...)


@dataclass(frozen=True, slots=True)
class XidRecord:
    xid: int
    bus_id: str | None  # canonical, see normalize_bus_id
    message: str  # the NVRM message, envelope removed
    pid: int | None = None
    name: str | None = None  # process name as the driver prints it
    channel: str | None = None  # e.g. "0x0000000a"
    detail: str = ""  # what follows the pid/name/channel fields
    gpu_lost: bool = False  # Xid 79 or "GPU has fallen off the bus"
    nvlink: NvlinkDetail | None = None
    record: KernelRecord = field(default_factory=lambda: KernelRecord(""))


@dataclass(frozen=True, slots=True)
class GpuUuidRecord:
    bus_id: str  # canonical
    uuid: str
    record: KernelRecord = field(default_factory=lambda: KernelRecord(""))


# 4,360,28939261,c;NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3, channel 0x0000000a
# 6,1234,5678,-,caller=T1;message   (kernels built with CONFIG_PRINTK_CALLER add a field)
_KMSG = re.compile(r"^(?P<prio>\d{1,5}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]*;(?P<msg>.*)$", re.S)
# [12345.678901] NVRM: Xid ...   (dmesg's default stamp: seconds since boot)
_DMESG_STAMP = re.compile(r"^\[\s*(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\]\s?")

# Everything of interest starts at "NVRM: "; what precedes it (a dmesg stamp, a journal's
# "Oct 01 13:00:00 host kernel: ", an ISO time) is envelope.
_NVRM = "NVRM: "

# NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3, channel 0x0000000a
# NVRM: Xid (PCI:0000:00:06): 31, pid=444, name=python3, channel 0x0000000a, intr 00000000. MMU Fault: ...
# NVRM: Xid (0000:03:00): 14, Channel 00000001                      (older drivers: no "PCI:")
# NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
# NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
# NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.
# NVRM: Xid (PCI:0000:01:00): 79                                   (nothing after the code)
# NVRM: Xid (PCI:0000:00:01.0): 79, pid='<unknown>', ...           (function included)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?)\):"
    r"\s*(?P<xid>\d{1,6})(?:,\s*(?P<rest>.*)|\s*)$",
    re.S,
)
# Loose fallback for forms we have not seen (gpud's rule): "NVRM: Xid <anything>: 43,"
_XID_LOOSE = re.compile(r"NVRM: Xid.*?: (?P<xid>\d{1,6})(?:,|$)")

# pid=415,  pid='<unknown>',  pid=<unknown>,
# At most 10 digits (pid_max is 2**22): a longer run is not a pid, and int() of a 20,000-digit
# one raises; such a field is left unread, in ``detail``.
_PID = re.compile(r"^pid=(?:'?(?P<pid>\d{1,10})'?|'?<unknown>'?)\s*(?:,\s*|$)")
# name=python3,  name=<unknown>,  name=pt_main_thread,
# Greedy up to the comma, trailing blanks stripped after: a lazy name followed by \s* is
# quadratic on a run of blanks without a comma.
_NAME = re.compile(r"^name=(?P<name>[^,]*)(?:,\s*|$)")
# channel 0x0000000a   Ch 00000008   Channel ID 00000009   Channel 00000001
_CHANNEL = re.compile(r"^(?:channel|Ch|Channel ID|Channel)\s+(?P<ch>(?:0x)?[0-9a-fA-F]+)\b\s*,?\s*")

# NVLink5 (Xid 144-150), after the code:
# 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)
# 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x01000011 0x00000000 0x00000000 0x00000000)
_NVLINK = re.compile(
    r"^(?P<unit>[A-Z][A-Z0-9_/]*) (?P<sev>Fatal|Nonfatal) XC(?P<xc>\d+) i(?P<i>\d+) Link (?P<link>\d+)"
    r" \((?P<words>0x[0-9a-fA-F]+(?: 0x[0-9a-fA-F]+)*)\)"
)

# NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.
_FALLEN = re.compile(
    r"NVRM: GPU at (?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?):?"
    r"\s*GPU has fallen off the bus"
)
# NVRM: GPU at PCI:0000:00:06: GPU-00000000-1111-2222-3333-444444444444
_UUID = re.compile(
    r"NVRM: GPU at (?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?):\s*"
    r"(?P<uuid>GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\s*$"
)

# NVML's "00000000:00:06.0", the kernel's "0000:00:06", sysfs' "0000:00:06.0"
_BUS = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)

GPU_LOST_XID = 79


def normalize_bus_id(raw: str) -> str:
    """Canonical bus id ``dddd:bb:dd.f`` (lowercase) from the kernel's or NVML's form.

    ``0000:00:06`` -> ``0000:00:06.0``; ``00000000:00:06.0`` -> ``0000:00:06.0``.
    A missing domain is 0, a missing function 0. Raises XidParseError on anything else.
    """
    m = _BUS.match(raw.strip())
    if m is None:
        raise XidParseError(f"not a PCI bus id: {raw[:80]!r}")
    domain = int(m.group("domain") or "0", 16)
    bus = int(m.group("bus"), 16)
    dev = int(m.group("dev"), 16)
    fn = int(m.group("fn") or "0")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def split_record(raw: str) -> KernelRecord:
    """Take the envelope off one record: kmsg header, dmesg stamp; never raises."""
    text = raw.split("\n", 1)[0].rstrip("\r")  # kmsg continuation lines (" KEY=VAL") follow "\n"
    m = _KMSG.match(text)
    if m is not None:
        return KernelRecord(
            message=m.group("msg"),
            priority=int(m.group("prio")) & 7,  # the facility lives in the upper bits
            seq=int(m.group("seq")),
            usec=int(m.group("usec")),
        )
    m = _DMESG_STAMP.match(text)
    if m is not None:
        frac = (m.group("frac") + "000000")[:6]
        return KernelRecord(message=text[m.end() :], usec=int(m.group("sec")) * 1_000_000 + int(frac))
    return KernelRecord(message=text)


def parse_line(raw: str) -> XidRecord | GpuUuidRecord | None:
    """Parse one kernel log record; ``None`` when it is not about an NVIDIA GPU fault/UUID."""
    record = split_record(raw)
    at = record.message.find(_NVRM)
    if at < 0:
        return None
    message = record.message[at:]
    if message.startswith("NVRM: Xid"):
        return _parse_xid(message, record)
    if message.startswith("NVRM: GPU at"):
        m = _FALLEN.match(message)
        if m is not None:
            return XidRecord(
                xid=GPU_LOST_XID,
                bus_id=normalize_bus_id(m.group("bus")),
                message=message,
                detail="GPU has fallen off the bus",
                gpu_lost=True,
                record=record,
            )
        m = _UUID.match(message)
        if m is not None:
            return GpuUuidRecord(bus_id=normalize_bus_id(m.group("bus")), uuid=m.group("uuid"), record=record)
    return None


def _parse_xid(message: str, record: KernelRecord) -> XidRecord:
    m = _XID.match(message)
    if m is None:
        loose = _XID_LOOSE.match(message)
        if loose is None:
            raise XidParseError(f"unreadable Xid line: {message[:120]!r}")
        xid = int(loose.group("xid"))
        return XidRecord(
            xid=xid,
            bus_id=None,
            message=message,
            detail=message[loose.end() :].strip(),
            gpu_lost=xid == GPU_LOST_XID,
            record=record,
        )
    xid = int(m.group("xid"))
    rest = (m.group("rest") or "").strip()
    pid = name = channel = None
    # The driver prints pid, name and channel in this order, each optional.
    pm = _PID.match(rest)
    if pm is not None:
        pid = int(pm.group("pid")) if pm.group("pid") else None
        rest = rest[pm.end() :]
    nm = _NAME.match(rest)
    if nm is not None:
        raw_name = nm.group("name").rstrip().strip("'")
        name = None if raw_name in ("<unknown>", "") else raw_name
        rest = rest[nm.end() :]
    cm = _CHANNEL.match(rest)
    if cm is not None:
        channel = cm.group("ch")
        rest = rest[cm.end() :]
    nvlink = None
    lm = _NVLINK.match(rest)
    if lm is not None:
        nvlink = NvlinkDetail(
            unit=lm.group("unit"),
            fatal=lm.group("sev") == "Fatal",
            xc=int(lm.group("xc")),
            instance=int(lm.group("i")),
            link=int(lm.group("link")),
            words=tuple(int(w, 16) for w in lm.group("words").split()),
        )
    return XidRecord(
        xid=xid,
        bus_id=normalize_bus_id(m.group("bus")),
        message=message,
        pid=pid,
        name=name,
        channel=channel,
        detail=rest.strip(),
        gpu_lost=xid == GPU_LOST_XID or "fallen off the bus" in rest,
        nvlink=nvlink,
        record=record,
    )
