"""EngineLogSource: tail -F semantics, stdin, garbage bytes, records emitted."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.model import Event, EventKind, LogLine, MetricsScrape
from collector.parsers.vllm_log import parse_line
from collector.sources.base import SourceError
from collector.sources.engine_log import EngineLogSource, keep_line

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"
FAST = {"poll_interval": 0.02, "idle_flush": 0.1}


class ListSink:
    def __init__(self) -> None:
        self.items: list[object] = []

    def emit(self, item: object) -> None:
        self.items.append(item)

    def lines(self) -> list[str]:
        return [i.line for i in self.items if isinstance(i, LogLine)]

    def events(self) -> list[Event]:
        return [i for i in self.items if isinstance(i, Event)]


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def _with_source(source: EngineLogSource, sink: ListSink, body) -> None:
    task = asyncio.create_task(source.run(sink))
    try:
        await body()
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    if task.done() and not task.cancelled() and task.exception():
        raise task.exception()


def _append(path: Path, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, "ab") as fh:
        fh.write(data)


def test_starts_at_the_end_and_follows_appends(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("old line 1\nold line 2\n")
    sink, src = ListSink(), EngineLogSource("e0", log, keep="all", **FAST)

    async def body():
        await asyncio.sleep(0.1)
        _append(log, "new line\n")
        await _until(lambda: "new line" in sink.lines())

    asyncio.run(_with_source(src, sink, body))
    assert sink.lines() == ["new line"]


def test_rotation_by_rename(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("")
    sink, src = ListSink(), EngineLogSource("e0", log, keep="all", **FAST)

    async def body():
        await asyncio.sleep(0.1)
        _append(log, "before rotation\n")
        await _until(lambda: "before rotation" in sink.lines())
        os.rename(log, tmp_path / "vllm.log.1")
        _append(tmp_path / "vllm.log.1", "late write to the old file\n")
        await asyncio.sleep(0.1)
        _append(log, "in the new file\n")
        await _until(lambda: "in the new file" in sink.lines())

    asyncio.run(_with_source(src, sink, body))
    assert sink.lines() == ["before rotation", "late write to the old file", "in the new file"]


def test_truncation_starts_again_at_zero(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("")
    sink, src = ListSink(), EngineLogSource("e0", log, keep="all", **FAST)

    async def body():
        await asyncio.sleep(0.1)
        _append(log, "a fairly long first line before the truncation\n")
        await _until(lambda: len(sink.lines()) == 1)
        with open(log, "wb"):
            pass  # copytruncate
        await asyncio.sleep(0.1)
        _append(log, "after\n")
        await _until(lambda: "after" in sink.lines())

    asyncio.run(_with_source(src, sink, body))
    assert sink.lines() == ["a fairly long first line before the truncation", "after"]


def test_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    log = tmp_path / "later.log"
    sink, src = ListSink(), EngineLogSource("e0", log, keep="all", **FAST)

    async def body():
        await asyncio.sleep(0.15)
        log.write_text("first line of a new file\n")  # read from its start
        await _until(lambda: sink.lines() == ["first line of a new file"])

    asyncio.run(_with_source(src, sink, body))


def test_garbage_bytes_are_replaced_not_fatal(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("")
    sink, src = ListSink(), EngineLogSource("e0", log, keep="all", **FAST)

    async def body():
        await asyncio.sleep(0.1)
        _append(log, b"\xff\xfe\x00bin\x80ary\n" + "caf\u00e9 ok\n".encode())
        await _until(lambda: len(sink.lines()) == 2)

    asyncio.run(_with_source(src, sink, body))
    assert sink.lines() == ["\ufffd\ufffd\x00bin\ufffdary", "caf\u00e9 ok"]


def test_an_unreadable_log_is_a_source_error(tmp_path):
    # a folder is a container's log folder (tests/sources/test_cri_follow.py); its newest
    # N.log being no file is an error the operator must see
    (tmp_path / "0.log").mkdir()
    src = EngineLogSource("e0", tmp_path, **FAST)
    with pytest.raises(SourceError):
        asyncio.run(asyncio.wait_for(src.run(ListSink()), 5))


def test_real_crash_log_from_start(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes((FIXTURES / "crash.log").read_bytes())
    sink = ListSink()
    src = EngineLogSource("decode-0", log, from_start=True, **FAST)

    async def body():
        await _until(lambda: any(e.kind is EventKind.ENGINE_DEAD for e in sink.events()))

    asyncio.run(_with_source(src, sink, body))
    kinds = [e.kind for e in sink.events()]
    for kind in (EventKind.CUDA_ERROR, EventKind.CRASH_DUMP, EventKind.ENGINE_FATAL):
        assert kind in kinds
    assert all(e.engine == "decode-0" and e.source == "log" for e in sink.events())
    scrapes = [i for i in sink.items if isinstance(i, MetricsScrape)]
    stat_lines = [x for x in (FIXTURES / "crash.log").read_text().splitlines() if "Avg prompt throughput" in x]
    assert len(scrapes) == len(stat_lines) > 0
    assert all(s.origin == "log" and "num_requests_running" in s.values for s in scrapes)
    # the default filter keeps errors and stat lines, drops the access log
    kept = sink.lines()
    assert not any('"POST /v1/completions HTTP/1.1" 200 OK' in x for x in kept)
    assert any("EngineCore encountered a fatal error." in x for x in kept)
    assert sum("Avg prompt throughput" in x for x in kept) == len(stat_lines)


def test_stdin_stream_flushes_at_end_of_stream():
    read_fd, write_fd = os.pipe()
    lines = (FIXTURES / "incident-decode-launch-blocking.log").read_bytes()
    sink = ListSink()
    with os.fdopen(read_fd, "rb") as stream:
        src = EngineLogSource("decode-0", None, stream=stream, poll_interval=0.02, idle_flush=30.0)

        async def body():
            await asyncio.sleep(0.05)
            os.write(write_fd, lines[:100])
            await asyncio.sleep(0.05)
            os.write(write_fd, lines[100:])
            os.close(write_fd)  # end of stream: the open traceback is emitted at once
            await _until(lambda: bool(sink.events()))

        asyncio.run(_with_source(src, sink, body))
    [event] = sink.events()
    assert event.kind is EventKind.CUDA_ERROR and event.process == "Worker_TP0"
    assert event.frames[-1]["code"] == "self.graphs[desc].replay()"


def test_exactly_one_of_path_and_stream():
    with pytest.raises(ValueError):
        EngineLogSource("e0", None)


@pytest.mark.parametrize(
    "raw,kept",
    [
        ('INFO:     127.0.0.1:50198 - "GET /health HTTP/1.1" 200 OK', False),
        ("(APIServer pid=1) INFO 11-30 14:39:22 [core.py:133] Initializing", False),
        ("(APIServer pid=1) INFO 11-30 14:43:01 [launcher.py:254] [shutdown] API server: shutdown triggered", True),
        ("(APIServer pid=1) WARNING 11-30 14:39:22 [x.py:1] libtcmalloc is not found", True),
        ('  File "x.py", line 3, in f', True),
        ("", False),
    ],
)
def test_keep_filter(raw, kept):
    assert keep_line(parse_line(raw)) is kept


def test_a_log_written_again_past_our_place_between_two_polls_is_read_from_its_start(tmp_path):
    """A server started again on the same log (``open(path, "w")``, same inode) whose new lines
    pass our place before the next poll: the size never looked smaller, the first line did."""
    from collector.sources.follow import FileTail

    log = tmp_path / "vllm.log"
    log.write_text("(APIServer pid=100) INFO 12-06 08:00:00 first run starts\n")
    tail = FileTail(log, from_start=True)
    assert tail.read_lines() == ["(APIServer pid=100) INFO 12-06 08:00:00 first run starts"]
    with open(log, "w") as f:  # the second run, same inode, more than the first wrote
        f.write("(APIServer pid=200) INFO 12-06 08:05:00 second run starts, a longer line\n")
        f.write("(EngineCore pid=201) ERROR 12-06 08:05:40 CUDA error: unspecified launch failure\n")
    got = tail.read_lines()
    assert got == [
        "(APIServer pid=200) INFO 12-06 08:05:00 second run starts, a longer line",
        "(EngineCore pid=201) ERROR 12-06 08:05:40 CUDA error: unspecified launch failure",
    ]
    assert tail.truncations == 1
    with open(log, "a") as f:  # appended to: no false restart
        f.write("more\n")
    assert tail.read_lines() == ["more"] and tail.truncations == 1
