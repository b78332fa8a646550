"""The Xid parser over real kernel log lines (an H200's /dev/kmsg) and published forms."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.xid.parser import (
    GpuUuidRecord,
    XidParseError,
    XidRecord,
    normalize_bus_id,
    parse_line,
    split_record,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kmsg-h200-xid.txt"
KMSG_LINES = FIXTURE.read_text().splitlines()

# What each line of the H200 fixture must give: None (not ours), ("uuid", bus, uuid) or
# ("xid", xid, bus, pid, name, channel, seq).
EXPECTED_FIXTURE = [
    None,  # loading NVIDIA UNIX Open Kernel Module
    None,  # gpuClearFbhubPoisonIntrForBug...
    None,  # Persistence mode is deprecated
    ("uuid", "0000:00:06.0", "GPU-00000000-1111-2222-3333-444444444444"),
    None,  # GPU Board Serial Number
    ("xid", 43, "0000:00:06.0", 415, "python3", "0x0000000a", 360),
    ("xid", 31, "0000:00:06.0", 444, "python3", "0x0000000a", 361),
    ("xid", 43, "0000:00:06.0", 467, "python3", "0x0000000a", 362),
]


def test_fixture_table_covers_every_line() -> None:
    assert len(KMSG_LINES) == len(EXPECTED_FIXTURE)


@pytest.mark.parametrize(("line", "expected"), list(zip(KMSG_LINES, EXPECTED_FIXTURE, strict=True)))
def test_h200_kmsg_fixture(line: str, expected: tuple[object, ...] | None) -> None:
    got = parse_line(line)
    if expected is None:
        assert got is None
    elif expected[0] == "uuid":
        assert isinstance(got, GpuUuidRecord)
        assert (got.bus_id, got.uuid) == expected[1:]
    else:
        assert isinstance(got, XidRecord)
        _, xid, bus, pid, name, channel, seq = expected
        assert (got.xid, got.bus_id, got.pid, got.name, got.channel) == (xid, bus, pid, name, channel)
        assert got.record.seq == seq
        assert got.record.priority == 4
        assert got.message.startswith("NVRM: Xid (PCI:0000:00:06)")
        assert not got.gpu_lost


# The same H200 seen through dmesg during the GPU drill (docs/gpu-runs): "[seconds] message".
DMESG = Path(__file__).parent.parent / "fixtures" / "dmesg-h200-xid-drill.txt"
DMESG_LINES = DMESG.read_text().splitlines()
EXPECTED_DMESG = (
    [None, None, None, ("uuid", 35319961)]
    + [None]
    + [("xid", xid, pid) for xid, pid in [(43, 448), (31, 472), (43, 494), (31, 520), (43, 542), (31, 564), (43, 590)]]
)


@pytest.mark.parametrize(("line", "expected"), list(zip(DMESG_LINES, EXPECTED_DMESG, strict=True)))
def test_h200_dmesg_drill_fixture(line: str, expected: tuple[object, ...] | None) -> None:
    got = parse_line(line)
    if expected is None:
        assert got is None
    elif expected[0] == "uuid":
        assert isinstance(got, GpuUuidRecord) and got.bus_id == "0000:00:06.0"
        assert got.record.usec == expected[1]
    else:
        assert isinstance(got, XidRecord)
        assert (got.xid, got.pid, got.name, got.bus_id, got.channel) == (expected[1], expected[2], "python3", "0000:00:06.0", "0x0000000a")
        assert got.record.usec is not None and got.record.usec > 35_000_000
        assert ("MMU Fault" in got.detail) == (expected[1] == 31)


def test_mmu_fault_detail_is_kept() -> None:
    got = parse_line(KMSG_LINES[6])
    assert isinstance(got, XidRecord)
    assert got.detail.startswith("intr 00000000. MMU Fault: ENGINE GRAPHICS")
    assert "FAULT_PDE ACCESS_TYPE_VIRT_WRITE" in got.detail


def test_kmsg_usec_is_read() -> None:
    got = parse_line(KMSG_LINES[5])
    assert isinstance(got, XidRecord)
    assert got.record.usec == 28939261


# Forms published elsewhere: (line, xid, bus, pid, name, channel, gpu_lost)
PUBLISHED = [
    # gpud components/accelerator/nvidia/xid/matcher.go (older driver: no "PCI:")
    ("[...] NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00.0", None, None, "00000001", False),
    # gpud matcher.go
    (
        "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        79,
        "0000:05:00.0",
        None,
        None,
        None,
        True,
    ),
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", 79, "0000:01:00.0", None, None, None, True),
    # gpud xid README (dmesg --ctime)
    (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
        "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        13,
        "0000:cb:00.0",
        None,
        None,
        None,
        False,
    ),
    (
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, "
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        109,
        "0000:cb:00.0",
        1797828,
        "pt_main_thread",
        "00000008",
        False,
    ),
    # a dmesg report of a display reset (Channel ID form)
    ("[ 1399.140323] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000", 32, "0000:01:00.0", None, None, "00000009", False),
    # a journal line; nothing after the code
    ("Sep 08 01:00:00 n1 kernel: NVRM: Xid (PCI:0000:01:00): 79", 79, "0000:01:00.0", None, None, None, True),
    # function number included
    (
        "[12345.678901] NVRM: Xid (PCI:0000:00:01.0): 79, pid='<unknown>', name='<unknown>', GPU has fallen off the bus.",
        79,
        "0000:00:01.0",
        None,
        None,
        None,
        True,
    ),
    # Xid 48 as a fault-injection log prints it
    (
        "NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
        48,
        "0000:01:00.0",
        None,
        None,
        None,
        False,
    ),
]


@pytest.mark.parametrize(("line", "xid", "bus", "pid", "name", "channel", "lost"), PUBLISHED)
def test_published_forms(line: str, xid: int, bus: str, pid: int | None, name: str | None, channel: str | None, lost: bool) -> None:
    got = parse_line(line)
    assert isinstance(got, XidRecord)
    assert (got.xid, got.bus_id, got.pid, got.name, got.channel, got.gpu_lost) == (xid, bus, pid, name, channel, lost)
    assert got.message.startswith("NVRM: Xid")


# NVLink5 extended form (Xid 144-150), lines from gpud's nvlink_logs_test.go
NVLINK = [
    (
        "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)",
        145,
        "RLW_REMAP",
        True,
        0,
        (4, 0x40, 0, 0),
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000001 0x00000000 0x00000000)",
        144,
        "SAW_MVB",
        False,
        0,
        (1, 1, 0, 0),
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 146, TLW_RX/TLW_RX_PIPE0 Nonfatal XC0 i0 Link 00 (0x0000000a 0x00000001 0x00000000 0x00000000)",
        146,
        "TLW_RX/TLW_RX_PIPE0",
        False,
        0,
        (10, 1, 0, 0),
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x02500011 0x00000000 0x00000000 0x00000000)",
        149,
        "NETIR_LINK_EVT/NETIR_LINK_DOWN",
        True,
        0,
        (0x02500011, 0, 0, 0),
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)",
        150,
        "MSE_WATCHDOG",
        True,
        0,
        (0, 0, 0, 0),
    ),
]


@pytest.mark.parametrize(("line", "xid", "unit", "fatal", "link", "words"), NVLINK)
def test_nvlink5_extended_form(line: str, xid: int, unit: str, fatal: bool, link: int, words: tuple[int, ...]) -> None:
    got = parse_line("6,900,1000,-;" + line)
    assert isinstance(got, XidRecord)
    assert got.xid == xid and got.bus_id == "0000:04:00.0"
    assert got.nvlink is not None
    assert (got.nvlink.unit, got.nvlink.fatal, got.nvlink.link, got.nvlink.words) == (unit, fatal, link, words)


def test_fallen_off_the_bus_line_is_gpu_lost() -> None:
    got = parse_line("3,1200,5000000,-;NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.")
    assert isinstance(got, XidRecord)
    assert (got.xid, got.bus_id, got.gpu_lost) == (79, "0000:3b:00.0", True)


@pytest.mark.parametrize(
    "line",
    [
        "6,1,2,-;usb 1-1: new high-speed USB device",
        "NVRM: GPU Board Serial Number: 0000000000000",
        "[  1.0] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
        "",
        "Xid 43 mentioned in prose without the driver prefix",
    ],
)
def test_other_lines_are_none(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize("line", ["NVRM: Xid (PCI:0000:00:06)", "NVRM: Xid garbage", "4,1,1,-;NVRM: Xid (PCI:zz): x,"])
def test_unreadable_xid_raises_own_error(line: str) -> None:
    with pytest.raises(XidParseError):
        parse_line(line)


def test_unfamiliar_xid_form_falls_back_to_code() -> None:
    got = parse_line("NVRM: Xid (GPU 3 on slot 7): 62, something new")
    assert isinstance(got, XidRecord)
    assert got.xid == 62 and got.bus_id is None


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("0000:00:06", "0000:00:06.0"),  # kernel
        ("00000000:00:06.0", "0000:00:06.0"),  # NVML
        ("PCI:0000:3B:00", "0000:3b:00.0"),
        ("0000:3b:00.1", "0000:3b:00.1"),
        ("3b:00", "0000:3b:00.0"),
        ("00000001:c1:00.0", "0001:c1:00.0"),
    ],
)
def test_normalize_bus_id(raw: str, canonical: str) -> None:
    assert normalize_bus_id(raw) == canonical


def test_kernel_and_nvml_forms_meet() -> None:
    assert normalize_bus_id("0000:00:06") == normalize_bus_id("00000000:00:06.0")


@pytest.mark.parametrize("raw", ["", "0000", "gpu0", "0000:00:06.9", "0000:000:06"])
def test_normalize_bus_id_rejects(raw: str) -> None:
    with pytest.raises(XidParseError):
        normalize_bus_id(raw)


def test_split_record_forms() -> None:
    assert split_record("4,360,28939261,c;NVRM: x\n SUBSYSTEM=pci").message == "NVRM: x"
    r = split_record("[12345.678901] NVRM: y")
    assert (r.message, r.usec) == ("NVRM: y", 12345678901)
    assert split_record("plain").message == "plain"


_PIECES = st.sampled_from(
    [
        "NVRM: ",
        "Xid ",
        "(PCI:",
        "0000:00:06",
        "00000000:",
        "): ",
        "43",
        ", ",
        "pid=",
        "'<unknown>'",
        "name=",
        "channel ",
        "0x0a",
        "GPU at ",
        "GPU has fallen off the bus",
        "GPU-",
        "4,360,28939261,c;",
        "[1.5] ",
        ";",
        "\n",
        "Fatal XC0 i0 Link 00 (0x1 0x2)",
        "RLW_REMAP ",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=14).map("".join))
def test_parser_raises_only_its_own_error(line: str) -> None:
    try:
        got = parse_line(line)
    except XidParseError:
        return
    assert got is None or isinstance(got, XidRecord | GpuUuidRecord)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_normalize_raises_only_its_own_error(raw: str) -> None:
    try:
        out = normalize_bus_id(raw)
    except XidParseError:
        return
    assert normalize_bus_id(out) == out
