"""Engine log source: follow a vLLM log file (or standard input) and turn it into records.

``EngineLogSource(engine, path)`` follows ``path`` like ``tail -F``: a file that does not
exist yet is waited for; a rotation by rename (the path names a new inode) drains the old
file and reads the new one from its start; a truncation in place (``copytruncate``, ``>``)
starts again from offset 0. By default it starts at the end of an existing file
(``from_start=False``): a restarted sidecar does not replay old crashes as new ones.
A ``path`` that is a folder (or ``cri=True``) is a container's log folder as the kubelet keeps
it, ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/``: its ``N.log`` files are read in the
runtime's CRI format, across container restarts and the kubelet's rotation
(``collector.sources.cri_follow``), and the lines handled are the container's own.
``EngineLogSource(engine, None, stream=sys.stdin.buffer)`` reads a pipe
(``vllm serve ... 2>&1 | flightrec serve``); at end of stream it flushes and idles.

File reads run in a worker thread (every follower's reads of one tick in one worker call,
``collector.sources.batched_reads``) and a stream is read by a daemon thread, so the event loop
never waits on the disk or the pipe. Bytes are split on ``\\n``
and decoded as UTF-8 with replacement: garbage never stops the source.

What it emits into the sink:

- ``Event`` (source "log") from ``LogEventizer``: CUDA/NCCL errors, engine fatal/dead,
  crash dumps, other tracebacks and ERROR lines (``collector/parsers/tracebacks.py``).
  A record that ends the log is emitted ``idle_flush`` seconds after its last line.
- ``MetricsScrape(origin="log")`` for each ``Engine NNN: Avg prompt throughput ...`` line:
  a 10 s fallback series when ``/metrics`` is not reachable.
- ``LogLine`` for the lines worth keeping in a snapshot. With ``keep="important"``
  (default) INFO/DEBUG lines are dropped (vLLM's and uvicorn's access log) unless they
  match an event pattern or are a stat or ``[shutdown]`` line; WARNING and above, and every
  line without a level (tracebacks on stderr, crash output) are kept. ``keep="all"`` keeps
  every line.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from datetime import tzinfo
from pathlib import Path
from typing import IO, Literal

from collector.model import LogLine, MetricsScrape
from collector.parsers.log_classify import classify
from collector.parsers.throughput_line import (
    ThroughputLineError,
    is_throughput_line,
    parse_throughput_line,
)
from collector.parsers.tracebacks import LogEventizer
from collector.parsers.vllm_log import LogRecordLine, parse_line
from collector.sources.base import Sink
from collector.sources.batched_reads import read_in_thread
from collector.sources.cri_follow import CriFolderTail
from collector.sources.engine_log_settings import DEFAULT_IDLE_FLUSH, DEFAULT_POLL_INTERVAL
from collector.sources.follow import DEFAULT_MAX_LINE_BYTES, FileTail, LineSplitter
from collector.ticks import next_tick, sleep_to_tick

_UVICORN_QUIET = re.compile(r"^(?:INFO|DEBUG):\s")
_ALWAYS_KEEP = re.compile(r"\[shutdown\]|Traceback \(most recent call last\)")


def keep_line(line: LogRecordLine) -> bool:
    """The ``keep="important"`` filter for LogLine records (see module docstring)."""
    if line.level is not None:
        if line.level not in ("DEBUG", "INFO"):
            return True
    elif not _UVICORN_QUIET.match(line.message):
        return bool(line.message.strip())
    return bool(is_throughput_line(line.message) or _ALWAYS_KEEP.search(line.message) or classify(line.message))


class EngineLogSource:
    """Follow one engine's log; see the module docstring."""

    def __init__(
        self,
        engine: str,
        path: Path | str | None,
        *,
        stream: IO[bytes] | None = None,
        from_start: bool = False,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        idle_flush: float = DEFAULT_IDLE_FLUSH,
        keep: Literal["important", "all"] = "important",
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        clock: Callable[[], float] = time.time,
        tz: tzinfo | None = None,
        cri: bool = False,
    ) -> None:
        if (path is None) == (stream is None):
            raise ValueError("give exactly one of path and stream")
        self.engine = engine
        self.path = Path(path) if path is not None else None
        self.stream = stream
        self.from_start = from_start
        self.poll_interval = poll_interval
        self.idle_flush = idle_flush
        self.keep = keep
        self.max_line_bytes = max_line_bytes
        self.cri = cri
        self.clock = clock
        self.name = f"engine_log:{engine}"
        self.eventizer = LogEventizer(engine, reference_clock=clock, tz=tz)
        self.lines_read = 0

    # -- per line -----------------------------------------------------------------------
    def handle_line(self, sink: Sink, raw: str) -> None:
        """Turn one raw line into records. Public so that tests and replays can drive it."""
        self.lines_read += 1
        line = parse_line(raw)
        now = self.clock()
        if self.keep == "all" or keep_line(line):
            sink.emit(LogLine(engine=self.engine, ts=now, line=line.text))
        if is_throughput_line(line.message):
            try:
                values = parse_throughput_line(line.message)
            except ThroughputLineError:
                values = {}
            numbers = {k: v for k, v in values.items() if isinstance(v, float)}
            if numbers:
                sink.emit(
                    MetricsScrape(
                        engine=self.engine,
                        ts=self.eventizer.timestamp_of(line),
                        values=numbers,
                        origin="log",
                    )
                )
        for event in self.eventizer.feed_line(line, now):
            sink.emit(event)

    def flush(self, sink: Sink, *, idle: float | None) -> None:
        for event in self.eventizer.flush(idle=idle, now=self.clock()):
            sink.emit(event)

    # -- running ------------------------------------------------------------------------
    async def run(self, sink: Sink) -> None:
        if self.stream is not None:
            await self._run_stream(sink, self.stream)
        else:
            assert self.path is not None
            await self._run_file(sink, self.path)

    async def _run_file(self, sink: Sink, path: Path) -> None:
        tail: FileTail | CriFolderTail
        if self.cri or path.is_dir():
            tail = CriFolderTail(path, from_start=self.from_start, max_line_bytes=self.max_line_bytes)
        else:
            tail = FileTail(path, from_start=self.from_start, max_line_bytes=self.max_line_bytes)
        partial_since: float | None = None
        try:
            while True:
                lines = await read_in_thread(tail.read_lines)  # with the other followers' reads
                for raw in lines:
                    self.handle_line(sink, raw)
                # A last line without its newline (a process killed mid-write) is taken
                # as a line once it has been quiet as long as a record is.
                splitter = tail if isinstance(tail, CriFolderTail) else tail.splitter
                if splitter.has_partial:
                    partial_since = partial_since or self.clock()
                    if self.clock() - partial_since >= self.idle_flush:
                        for raw in splitter.take_partial():
                            self.handle_line(sink, raw)
                        partial_since = None
                else:
                    partial_since = None
                self.flush(sink, idle=self.idle_flush)
                await sleep_to_tick(self.poll_interval)
        finally:
            tail.close()

    async def _run_stream(self, sink: Sink, stream: IO[bytes]) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1024)
        stop = threading.Event()

        def put(item: bytes | None) -> None:
            # Called on the loop thread. A full queue means the loop is far behind: wait
            # in the reader thread rather than lose log lines.
            queue.put_nowait(item)

        def reader() -> None:
            read = getattr(stream, "read1", None) or stream.read
            try:
                while not stop.is_set():
                    data = read(65536)
                    if isinstance(data, str):  # a text stream was passed: accept it
                        data = data.encode("utf-8", "replace")
                    while queue.qsize() >= queue.maxsize - 1 and not stop.is_set():
                        time.sleep(0.01)
                    loop.call_soon_threadsafe(put, data if data else None)
                    if not data:
                        return
            except (OSError, ValueError, RuntimeError):
                # Stream closed under us, or the loop is gone at shutdown.
                try:
                    loop.call_soon_threadsafe(put, None)
                except RuntimeError:
                    pass

        # A daemon thread: a read blocked on a quiet pipe must not keep the process alive.
        thread = threading.Thread(target=reader, name=f"{self.name}-reader", daemon=True)
        thread.start()
        splitter = LineSplitter(self.max_line_bytes)
        try:
            while True:
                try:
                    data = await asyncio.wait_for(queue.get(), timeout=next_tick(loop.time(), self.poll_interval) - loop.time())
                except TimeoutError:
                    self.flush(sink, idle=self.idle_flush)
                    continue
                if data is None:
                    for raw in splitter.take_partial():
                        self.handle_line(sink, raw)
                    self.flush(sink, idle=None)
                    break
                for raw in splitter.feed(data):
                    self.handle_line(sink, raw)
                self.flush(sink, idle=self.idle_flush)
            # The stream is over; nothing will come again. Stay (do not be restarted) until
            # the service stops us.
            await asyncio.Event().wait()
        finally:
            stop.set()
