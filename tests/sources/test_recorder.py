"""The sidecar's end of the recorder channel, over ring files written the way the in-engine
recorder writes them."""

from __future__ import annotations

import os
from pathlib import Path

from collector.channel.codec import encode, encode_requests, encode_step_fields
from collector.channel.naming import ring_file_name
from collector.channel.ringfile import RingWriter
from collector.model import Event, EventKind, Observation, RequestRow, StepRecord
from collector.sources.recorder import RecorderSource


class ListSink:
    def __init__(self) -> None:
        self.items: list[Observation] = []

    def emit(self, item: Observation) -> None:
        self.items.append(item)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def meta(engine: str, role: str, pid: int) -> bytes:
    return encode({"t": "meta", "engine": engine, "engine_index": 0, "role": role, "pid": pid, "vllm_version": "0.32.0"})


def step(n: int, ts: float) -> bytes:
    return encode_step_fields(n, ts, 0, 2, 1, 0, 0.25, 0, 10, 2, 0, 0, 0)


def writer(folder: Path, engine: str, role: str, pid: int, capacity: int = 1 << 16) -> RingWriter:
    w = RingWriter(folder / ring_file_name(engine, role, pid), capacity=capacity)
    w.append(meta(engine, role, pid))
    return w


def test_both_halves_of_a_step_arrive_named_by_their_engine(tmp_path: Path) -> None:
    clock = Clock()
    stats = writer(tmp_path, "decode-0", "stats", 11)
    sched = writer(tmp_path, "decode-0", "sched", 12)
    stats.append(step(1, 999.0))
    sched.append(encode_requests("decode-0", 1, 999.0, [RequestRow("r1", 300, 300, 1)]))
    sink = ListSink()
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: True)
    assert src.poll(sink) == 2
    steps = [o for o in sink.items if isinstance(o, StepRecord)]
    assert {(s.engine, s.step) for s in steps} == {("decode-0", 1)}
    req = next(s for s in steps if s.requests is not None)
    assert req.requests == [RequestRow("r1", 300, 300, 1)]


def test_dp_engine_name_survives_the_file_name(tmp_path: Path) -> None:
    # A small ring that wrapped past its meta record: the file name still names the engine.
    w = RingWriter(tmp_path / ring_file_name("decode-0/dp1", "stats", 5), capacity=4096)
    w.append(meta("decode-0/dp1", "stats", 5))
    for n in range(1, 200):
        w.append(step(n, 999.0))
    sink = ListSink()
    RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True).poll(sink)
    assert sink.items and {o.engine for o in sink.items} == {"decode-0/dp1"}  # type: ignore[union-attr]
    assert sink.items[-1].step == 199  # type: ignore[union-attr]


def test_silent_ring_of_a_dead_writer_is_reported_once_after_its_last_steps(tmp_path: Path) -> None:
    clock = Clock()
    alive = [True]
    w = writer(tmp_path, "decode-0", "sched", 21)
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: alive[0], silent_after=1.0)
    sink = ListSink()
    for n in range(1, 6):
        w.append(encode_requests("decode-0", n, clock.now, [RequestRow("r", 5, n)]))
        src.poll(sink)
        clock.now += 0.1
    alive[0] = False  # SIGKILL: no more records, process gone
    clock.now += 0.5
    src.poll(sink)
    assert not [o for o in sink.items if isinstance(o, Event)]  # not yet silent long enough
    clock.now += 1.0
    src.poll(sink)
    clock.now += 5.0
    src.poll(sink)
    events = [o for o in sink.items if isinstance(o, Event)]
    assert [e.kind for e in events] == [EventKind.RECORDER_SILENT]
    assert events[0].engine == "decode-0" and events[0].pid == os.getpid()  # the ring header's
    assert max(o.step for o in sink.items if isinstance(o, StepRecord)) == 5
    assert sink.items.index(events[0]) == len(sink.items) - 1


def test_live_writer_that_pauses_is_not_silent(tmp_path: Path) -> None:
    clock = Clock()
    w = writer(tmp_path, "e", "stats", 31)
    w.append(step(1, clock.now))
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: True)
    sink = ListSink()
    src.poll(sink)
    clock.now += 60
    src.poll(sink)
    assert not [o for o in sink.items if isinstance(o, Event)]


def test_restarted_sidecar_picks_up_what_the_ring_holds(tmp_path: Path) -> None:
    clock = Clock()
    w = writer(tmp_path, "e", "stats", 41)
    for n in range(1, 11):
        w.append(step(n, clock.now))
    first, second = ListSink(), ListSink()
    RecorderSource(tmp_path, clock=clock, alive=lambda pid: True).poll(first)
    w.append(step(11, clock.now))
    RecorderSource(tmp_path, clock=clock, alive=lambda pid: True).poll(second)
    assert [o.step for o in second.items] == list(range(1, 12))  # type: ignore[union-attr]
    assert [o.step for o in first.items] == list(range(1, 11))  # type: ignore[union-attr]


def test_ring_of_an_engine_that_died_long_ago_is_history_not_news(tmp_path: Path) -> None:
    clock = Clock(now=100_000.0)
    w = writer(tmp_path, "e", "sched", 51)
    w.append(encode_requests("e", 1, 1000.0, [RequestRow("r", 5, 5)]))
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: False)
    sink = ListSink()
    src.poll(sink)
    clock.now += 10
    src.poll(sink)
    assert [type(o) for o in sink.items] == [StepRecord]
