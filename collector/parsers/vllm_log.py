"""Split one vLLM log line into its process prefix, record header and message.

vLLM 0.32 formats every record as (``vllm/logger.py``)::

    (EngineCore pid=10277) INFO 11-30 14:39:22 [core.py:133] Initializing a V1 LLM engine ...
    (Worker_TP0 pid=3107) ERROR 09-13 10:41:07 [multiproc_executor.py:1063] Traceback ...

A multi-line message (``logger.exception`` and its traceback) repeats the whole header on
each line, joined with ``\\r\\n``; so the trailing ``\\r`` is dropped here. Other lines carry
no header: uvicorn's (``INFO:     Started server process [10174]``), Python's own traceback
on stderr, or a header without the process prefix (older builds, ``INFO 09-13 ...``).
With a terminal (or ``VLLM_LOGGING_COLOR=1``) the prefix, level and location are wrapped in
ANSI colour codes, which are stripped first.

The year is not in vLLM's timestamps. ``parse_timestamp`` takes a reference datetime (the
reading clock for a live log, the file's mtime offline) and uses its year and time zone,
since vLLM writes local time; a date that would land more than a day after the reference
belongs to the year before (a December log read in January).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

# Colour sequences of vLLM's ColoredFormatter (\033[32m, \033[0;36m, \033[0;0m) and any other
# CSI sequence a terminal logger might add.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# "(EngineCore pid=10277) ", "(Worker_TP1 pid=3108) ", "(APIServer pid=10174) ",
# "(VllmWorker-0 pid=10552) ", "(EngineCore_DP0 pid=7) ". Anywhere near the line start:
# VLLM_LOGGING_PREFIX may put text before it.
_PREFIX = re.compile(r"\((?P<process>[A-Za-z_][\w.\-]*) pid=(?P<pid>\d{1,10})\) ?")

# "INFO 11-30 14:39:22 [core.py:133] " (fileinfo may be a shrunk path in DEBUG mode).
_HEADER = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<ts>\d{2}-\d{2} \d{2}:\d{2}:\d{2}) "
    r"\[(?P<location>[^\]\s]{1,200}:\d{1,7})\] ?"
)

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True, slots=True)
class LogRecordLine:
    """One physical log line, taken apart. Fields absent from the line are ``None``."""

    text: str  # the whole line, ANSI codes and line ending removed
    message: str  # what follows the header (or the prefix, or the whole line)
    process: str | None = None  # "EngineCore", "Worker_TP1", "APIServer"
    pid: int | None = None
    level: str | None = None
    stamp: str | None = None  # "11-30 14:39:22", as written
    location: str | None = None  # "core.py:133"

    @property
    def key(self) -> tuple[str | None, int | None]:
        """Which process wrote the line: lines of several processes interleave in one log."""
        return (self.process, self.pid)

    @property
    def header(self) -> tuple[str, str, str] | None:
        """Identity of the log record: every line of one multi-line record shares it."""
        if self.level is None or self.stamp is None or self.location is None:
            return None
        return (self.level, self.stamp, self.location)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def parse_line(raw: str) -> LogRecordLine:
    """Take one line apart. Never raises: an unknown line is all message."""
    text = strip_ansi(raw).rstrip("\r\n")
    rest = text
    process: str | None = None
    pid: int | None = None
    m = _PREFIX.match(text)
    if m is None:
        # VLLM_LOGGING_PREFIX may put a short text before the prefix: accept a prefix further
        # in only when a full record header follows it, so a message that quotes one is not
        # mistaken for a line of that process.
        m = _PREFIX.search(text, 0, 80)
        if m is not None and _HEADER.match(text, m.end()) is None:
            m = None
    if m is not None:
        process, pid = m.group("process"), int(m.group("pid"))
        rest = text[m.end() :]
    h = _HEADER.match(rest)
    if h is None:
        return LogRecordLine(text=text, message=rest, process=process, pid=pid)
    return LogRecordLine(
        text=text,
        message=rest[h.end() :],
        process=process,
        pid=pid,
        level=h.group("level"),
        stamp=h.group("ts"),
        location=h.group("location"),
    )


def parse_timestamp(stamp: str, reference: datetime) -> datetime | None:
    """``"09-13 10:41:07"`` -> an aware (if ``reference`` is) datetime in the reference's year.

    Returns ``None`` for an impossible date (``02-30``). A result more than one day after
    ``reference`` is moved to the year before: logs are read after they are written.
    """
    try:
        month, day = int(stamp[0:2]), int(stamp[3:5])
        hour, minute, second = int(stamp[6:8]), int(stamp[9:11]), int(stamp[12:14])
    except (ValueError, IndexError):
        return None
    for year in (reference.year, reference.year - 1):
        try:
            value = datetime(year, month, day, hour, minute, second, tzinfo=reference.tzinfo)
        except ValueError:
            continue  # 02-29 outside a leap year: try the year before
        if value - reference <= timedelta(days=1):
            return value
    return None
