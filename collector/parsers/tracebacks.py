"""Engine log lines -> Events: tracebacks grouped per process, faults and deaths classified.

``LogEventizer`` is stateful but does no I/O: feed it lines one at a time, it returns the
events that those lines completed. Lines of several processes interleave in one vLLM log
(two TP workers failing in the same step), so everything is kept per process key
``(process, pid)``.

What makes one event:

- A *log record*: vLLM repeats the whole header (``(EngineCore pid=7) ERROR 11-30 14:41:07
  [core.py:1512] ``) on every line of a multi-line message, so consecutive lines of one
  process with the same header are one record (``logger.exception``: a lead message, then
  the traceback). A record is complete when the next line of that process has another
  header, or on ``flush``.
- A bare traceback (Python's own, on stderr, with or without the process prefix) follows
  the traceback grammar: ``Traceback ...``, ``File`` lines with their code, the exception
  line, torch's hint lines, chained ``During handling ...`` sections.
- vLLM's crash dump (``Dumping input data ...``, ``Dumping scheduler output ...``,
  ``Dumping scheduler stats ...``): one CRASH_DUMP event with the rows and stats parsed.

Kinds, most specific first (an event takes the first that matches anywhere in its text and
lists every match in ``data["matches"]``): CUDA_ERROR, NCCL_ERROR, ENGINE_FATAL,
ENGINE_DEAD; otherwise a traceback or an ERROR/CRITICAL line is LOG; other lines make no
event. A CUDA error outranks NCCL: NCCL reports the CUDA fault it ran into.

Time: vLLM writes ``MM-DD HH:MM:SS`` in local time without a year. Each event's ``ts`` is
that stamp in the year of ``reference_clock()`` (see ``vllm_log.parse_timestamp``), in
time zone ``tz`` (default: this machine's). A line with no stamp takes the last stamp seen.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from collector.model import Event, EventKind, Severity
from collector.parsers.crash_dump import (
    CrashDumpParseError,
    parse_scheduler_output,
    parse_scheduler_stats,
    scalar,
)
from collector.parsers.log_classify import classify
from collector.parsers.traceback_grammar import _CHAIN, _EXC_TAIL, _TB_START, parse_frames
from collector.parsers.vllm_log import LogRecordLine, parse_line, parse_timestamp

MAX_RECORD_LINES = 400  # a record longer than this is closed and a new one started
MAX_LINE_CHARS = 4000  # raw lines kept in an event are cut to this (crash dumps are long)

_CRITICAL_KINDS = {
    EventKind.CUDA_ERROR,
    EventKind.NCCL_ERROR,
    EventKind.ENGINE_FATAL,
    EventKind.ENGINE_DEAD,
}

_EXIT_CODE = re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d{1,9})\)")
_DIED_PROC = re.compile(r"Engine core process (\S+) died unexpectedly")
_PID_EXIT = re.compile(r"Process (\S+) \(PID: (\d{1,10})\) died with exit code (-?\d{1,9})")

# A stop that was asked for (SIGINT/SIGTERM, Ctrl-C), and a fresh start that ends it:
# (APIServer pid=10174) INFO 11-30 14:43:01 [launcher.py:254] [shutdown] API server: shutdown
#   triggered
# (EngineCore pid=10277) INFO 11-30 14:43:01 [core.py:1454] [shutdown] EngineCore: trigger
#   received signal=SIGTERM
_SHUTDOWN_REQUESTED = re.compile(
    r"\[shutdown\] API server: shutdown triggered|trigger received signal=SIG(?:TERM|INT)"
    r"|Received KeyboardInterrupt"
)
# (APIServer pid=13692) INFO 11-30 14:43:59 [api_server.py:...] vLLM API server version 0.32.0
_STARTING = re.compile(r"vLLM API server version|Initializing a V1 LLM engine")

_DUMP_INPUT = "Dumping input data for V1 LLM engine"
_DUMP_OUTPUT = "Dumping scheduler output for model execution: "
_DUMP_STATS = "Dumping scheduler stats: "
_VERSION = re.compile(r"engine \(v([^)\s]+)\)")
# Deployment facts worth keeping from the config that the crash dump prints.
_CONFIG_KEYS = (
    "model",
    "dtype",
    "max_seq_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "quantization",
    "enforce_eager",
    "kv_cache_dtype",
    "device_config",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "load_format",
)
_CONFIG_VALUE = {key: re.compile(r"\b" + key + r"=('[^']*'|[^,\s]+)") for key in _CONFIG_KEYS}
_CUDAGRAPH_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")


@dataclass(slots=True)
class _Record:
    lines: list[LogRecordLine]
    header: tuple[str, str, str] | None
    last_seen: float
    first_no: int = 0  # line number of its first line in the stream (1-based)
    phase: str = ""  # bare traceback grammar: "frames", "exc", "sep"; "" for a headered record


@dataclass(slots=True)
class _Dump:
    first: LogRecordLine
    first_no: int = 0
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    last_seen: float = 0.0


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "...[cut]"


class LogEventizer:
    """Feed engine log lines, get Events. See the module docstring for the rules."""

    def __init__(
        self,
        engine: str | None = None,
        *,
        reference_clock: Callable[[], float] = time.time,
        tz: tzinfo | None = None,
    ) -> None:
        self.engine = engine
        self._clock = reference_clock
        self._tz = tz
        self._records: dict[tuple[str | None, int | None], _Record] = {}
        self._dumps: dict[tuple[str | None, int | None], _Dump] = {}
        self._last_ts: float | None = None
        self._shutting_down = False
        self._line_no = 0

    # -- time ---------------------------------------------------------------------------
    def timestamp_of(self, line: LogRecordLine) -> float:
        """Unix time of a line: its stamp (year from the reference clock), else the last one."""
        if line.stamp is not None:
            ref = self._clock()
            reference = datetime.fromtimestamp(ref, self._tz) if self._tz is not None else datetime.fromtimestamp(ref).astimezone()
            value = parse_timestamp(line.stamp, reference)
            if value is not None:
                self._last_ts = value.timestamp()
                return self._last_ts
        return self._last_ts if self._last_ts is not None else self._clock()

    # -- feeding ------------------------------------------------------------------------
    def feed(self, raw: str, now: float | None = None) -> list[Event]:
        return self.feed_line(parse_line(raw), now)

    def feed_line(self, line: LogRecordLine, now: float | None = None) -> list[Event]:
        """Take one parsed line; return the events it completed (often none)."""
        now = self._clock() if now is None else now
        self._line_no += 1
        if _SHUTDOWN_REQUESTED.search(line.message):
            self._shutting_down = True
        elif _STARTING.search(line.message):
            self._shutting_down = False
        key = line.key
        record = self._records.get(key)
        if record is not None and self._continues(record, line):
            record.lines.append(line)
            record.last_seen = now
            return []
        events: list[Event] = []
        if record is not None:
            events.extend(self._close(key))
        record = _Record([line], line.header, now, first_no=self._line_no)
        if line.header is None:
            if line.message.strip() == _TB_START:
                record.phase = "frames"
            else:
                # A bare line that starts no traceback is complete on its own.
                self._records[key] = record
                events.extend(self._close(key))
                return events
        self._records[key] = record
        return events

    def flush(self, idle: float | None = None, now: float | None = None) -> list[Event]:
        """Close records (and crash dumps) quiet for ``idle`` seconds; all of them if None.

        A live follower calls this each poll so that a traceback that ends the log (the
        process died after writing it) is still emitted.
        """
        now = self._clock() if now is None else now
        events: list[Event] = []
        for key in list(self._records):
            if idle is None or now - self._records[key].last_seen >= idle:
                events.extend(self._close(key))
        for key in list(self._dumps):
            if idle is None or now - self._dumps[key].last_seen >= idle:
                events.extend(self._emit_dump(key))
        return events

    # -- grouping -----------------------------------------------------------------------
    def _continues(self, record: _Record, line: LogRecordLine) -> bool:
        if len(record.lines) >= MAX_RECORD_LINES:
            return False
        if record.header is not None:
            return line.header == record.header
        if line.header is not None or not record.phase:
            return False
        msg = line.message.rstrip()
        stripped = msg.strip()
        if record.phase == "frames":
            if not stripped or msg[:1].isspace():
                return True
            record.phase = "exc"  # the exception line
            return True
        if record.phase == "exc":
            if not stripped or _EXC_TAIL.match(stripped) or msg[:1].isspace():
                return True
            if stripped in _CHAIN:
                record.phase = "sep"
                return True
            return False
        # "sep": after a chain separator, the next traceback
        if not stripped:
            return True
        if stripped == _TB_START:
            record.phase = "frames"
            return True
        return False

    def _close(self, key: tuple[str | None, int | None]) -> list[Event]:
        record = self._records.pop(key, None)
        if record is None:
            return []
        lines = record.lines
        while len(lines) > 1 and not lines[-1].message.strip():
            lines = lines[:-1]
        messages = [line.message for line in lines]
        events: list[Event] = []
        if any(m.strip() == _TB_START for m in messages):
            events.extend(self._emit_dump(key))
            events.append(self._traceback_event(lines, record.first_no))
            return events
        for i, line in enumerate(lines):
            events.extend(self._single(key, line, record.first_no + i))
        return events

    # -- events -------------------------------------------------------------------------
    def _event(
        self,
        kind: EventKind,
        first: LogRecordLine,
        message: str,
        *,
        line_no: int,
        severity: Severity,
        lines: list[str],
        frames: list[dict[str, Any]] | None = None,
        data: dict[str, Any] | None = None,
    ) -> Event:
        return Event(
            kind=kind,
            ts=self.timestamp_of(first),
            source="log",
            message=message,
            severity=severity,
            engine=self.engine,
            pid=first.pid,
            process=first.process,
            frames=frames or [],
            lines=[_cut(text) for text in lines],
            data={**(data or {}), "line": line_no},
        )

    def _traceback_event(self, lines: list[LogRecordLine], line_no: int) -> Event:
        messages = [line.message for line in lines]
        start = next(i for i, m in enumerate(messages) if m.strip() == _TB_START)
        lead = " ".join(m.strip() for m in messages[:start] if m.strip())
        frames, exceptions = parse_frames(messages[start:])
        matches = classify("\n".join(messages))
        # The record's own message names what happened in this process ("EngineCore
        # encountered a fatal error."); the traceback below it may name the cause (a CUDA
        # error relayed from a worker), which stays in data["matches"].
        lead_kinds = classify(lead) if lead else []
        kind = (lead_kinds or matches or [EventKind.LOG])[0]
        final = exceptions[-1] if exceptions else (lead or "traceback")
        data: dict[str, Any] = {
            "traceback": True,
            "exception": final,
            "exceptions": [e.split("\n", 1)[0] for e in exceptions],
            "matches": [k.value for k in matches],
        }
        if lead:
            data["lead"] = lead
        self._add_line_facts(data, lines[0])
        severity = Severity.CRITICAL if kind in _CRITICAL_KINDS else Severity.WARNING
        kind, severity = self._shutdown_filter(kind, severity, data)
        return self._event(
            kind,
            lines[0],
            final.split("\n", 1)[0],
            line_no=line_no,
            severity=severity,
            lines=[line.text for line in lines],
            frames=frames,
            data=data,
        )

    def _shutdown_filter(self, kind: EventKind, severity: Severity, data: dict[str, Any]) -> tuple[EventKind, Severity]:
        """A stop that was asked for is not a crash.

        vLLM 0.32 logs ``AsyncLLM output_handler failed ... EngineDeadError`` on every
        graceful stop (SIGINT/SIGTERM of the API server): after a shutdown request, engine
        death and fatal lines become LOG/INFO events marked ``during_shutdown``. CUDA and
        NCCL errors keep their kind: a fault during a stop is still a fault.
        """
        if self._shutting_down and kind in (EventKind.ENGINE_DEAD, EventKind.ENGINE_FATAL):
            data["during_shutdown"] = True
            return EventKind.LOG, Severity.INFO
        return kind, severity

    @staticmethod
    def _add_line_facts(data: dict[str, Any], line: LogRecordLine) -> None:
        if line.level is not None:
            data["level"] = line.level
        if line.location is not None:
            data["location"] = line.location

    def _single(self, key: tuple[str | None, int | None], line: LogRecordLine, line_no: int) -> list[Event]:
        msg = line.message
        if msg.startswith(_DUMP_INPUT):
            events = self._emit_dump(key)
            dump = _Dump(first=line, first_no=line_no, last_seen=self._clock())
            dump.lines.append(line.text)
            dump.data.update(_config_facts(msg))
            self._dumps[key] = dump
            return events
        if msg.startswith(_DUMP_OUTPUT):
            held = self._dumps.get(key)
            events = []
            if held is None or "requests" in held.data:
                events.extend(self._emit_dump(key))
                held = self._dumps[key] = _Dump(first=line, first_no=line_no)
            dump = held
            dump.last_seen = self._clock()
            dump.lines.append(line.text)
            try:
                parsed = parse_scheduler_output(msg[len(_DUMP_OUTPUT) :])
                dump.data["requests"] = parsed["requests"]
                dump.data["scheduler"] = parsed["scheduler"]
                dump.data["truncated"] = parsed["truncated"]
                if "row_mirrors" in parsed:  # HiSparse's host-mirror spans of this step, per request
                    dump.data["row_mirrors"] = parsed["row_mirrors"]
            except CrashDumpParseError as exc:
                dump.data["requests"] = []
                dump.data["error"] = f"scheduler output: {exc}"
            return events
        if msg.startswith(_DUMP_STATS):
            held = self._dumps.get(key)
            if held is None:
                held = self._dumps[key] = _Dump(first=line, first_no=line_no)
            dump = held
            dump.lines.append(line.text)
            try:
                dump.data["stats"] = parse_scheduler_stats(msg[len(_DUMP_STATS) :])
            except CrashDumpParseError as exc:
                dump.data["stats"] = {}
                dump.data["error"] = f"scheduler stats: {exc}"
            return self._emit_dump(key)

        events = self._emit_dump(key)  # any other record ends a crash dump of this process
        matches = classify(msg)
        if matches:
            kind = matches[0]
            data: dict[str, Any] = {"matches": [k.value for k in matches]}
            self._add_line_facts(data, line)
            _death_facts(msg, data)
            kind, severity = self._shutdown_filter(kind, Severity.CRITICAL, data)
            events.append(
                self._event(
                    kind,
                    line,
                    msg.strip(),
                    line_no=line_no,
                    severity=severity,
                    lines=[line.text],
                    data=data,
                )
            )
        elif line.level in ("ERROR", "CRITICAL"):
            data = {"matches": []}
            self._add_line_facts(data, line)
            severity = Severity.CRITICAL if line.level == "CRITICAL" else Severity.WARNING
            events.append(
                self._event(
                    EventKind.LOG,
                    line,
                    msg.strip(),
                    line_no=line_no,
                    severity=severity,
                    lines=[line.text],
                    data=data,
                )
            )
        return events

    def _emit_dump(self, key: tuple[str | None, int | None]) -> list[Event]:
        dump = self._dumps.pop(key, None)
        if dump is None:
            return []
        data = dump.data
        data.setdefault("requests", [])
        data.setdefault("stats", {})
        stats = data["stats"]
        parts = [f"{len(data['requests'])} scheduled requests"]
        for name in ("running", "waiting", "kv_cache_usage", "step_counter"):
            if name in stats:
                parts.append(f"{name}={stats[name]}")
        return [
            self._event(
                EventKind.CRASH_DUMP,
                dump.first,
                "vLLM crash dump: " + ", ".join(parts),
                line_no=dump.first_no,
                severity=Severity.CRITICAL,
                lines=dump.lines,
                data=data,
            )
        ]


def _config_facts(message: str) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    version = _VERSION.search(message)
    if version is not None:
        facts["vllm_version"] = version.group(1)
    config: dict[str, Any] = {}
    for key, pattern in _CONFIG_VALUE.items():
        m = pattern.search(message)
        if m is not None:
            value = m.group(1)
            config[key] = value.strip("'") if value.startswith("'") else scalar(value)
    mode = _CUDAGRAPH_MODE.search(message)
    if mode is not None:
        config["cudagraph_mode"] = mode.group(1)
    facts["config"] = config
    return facts


def _death_facts(message: str, data: dict[str, Any]) -> None:
    m = _EXIT_CODE.search(message)
    if m is not None:
        data["worker"] = m.group(1)
        data["exit_code"] = int(m.group(2))
        return
    m = _PID_EXIT.search(message)
    if m is not None:
        data["dead_process"] = m.group(1)
        data["dead_pid"] = int(m.group(2))
        data["exit_code"] = int(m.group(3))
        return
    m = _DIED_PROC.search(message)
    if m is not None:
        data["dead_process"] = m.group(1)
