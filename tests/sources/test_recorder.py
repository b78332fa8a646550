"""The sidecar's end of the recorder channel, over ring files written the way the in-engine
recorder writes them."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from collector.channel.codec import encode, encode_step_fields
from collector.channel.naming import ring_file_name
from collector.channel.ringfile import RingWriter
from collector.ingest.hub import hub_for
from collector.ingest.window import records_of
from collector.model import (
    HALF_REQUESTS,
    HALF_STATS,
    Event,
    EventKind,
    Observation,
    Severity,
    StepHalves,
    StepRecord,
)
from collector.settings import EngineConfig, Settings
from collector.sources.join import EngineJoin
from collector.sources.recorder import RecorderSource
from tests.request_columns import Row, encode_rows


class ListSink:
    """What a source emitted, a poll's step halves as the records ingest's window makes of
    them (merged per engine run, in step order, where the first came)."""

    def __init__(self) -> None:
        self.raw: list[Observation] = []

    def emit(self, item: Observation) -> None:
        self.raw.append(item)

    @property
    def items(self) -> list[Observation]:
        halves = [o for o in self.raw if isinstance(o, StepHalves)]
        out: list[Observation] = []
        for o in self.raw:
            if not isinstance(o, StepHalves):
                out.append(o)
            elif o is halves[0]:
                out.extend(records_of(halves))
        return out


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
    sched.append(encode_rows(1, 999.0, [Row("r1", 300, 300, 1)]))
    sink = ListSink()
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: True)
    assert src.poll(sink) == 2
    # read in one poll, the two halves (one read of each ring) merge in ingest's window
    [rec] = [o for o in sink.items if isinstance(o, StepRecord)]
    assert (rec.engine, rec.step, rec.halves) == ("decode-0", 1, HALF_STATS | HALF_REQUESTS)
    # the scheduler's half carries the recorder's bytes, decoded only when read
    assert rec.request_block is not None
    assert rec.request_block.column("request_id") == ["r1"]
    assert rec.request_block.column("computed_tokens") == [300] and rec.request_block.column("output_tokens") == [1]
    assert (rec.running, rec.waiting, rec.kv_cache_usage) == (2, 1, 0.25)  # the stats half's figures

    # read in two polls, each half is handed on alone (ingest's window merges them)
    sched.append(encode_rows(2, 999.5, [Row("r1", 300, 301, 2)]))
    sink = ListSink()
    assert src.poll(sink) == 1
    [req] = sink.items
    assert isinstance(req, StepRecord) and req.halves == HALF_REQUESTS and req.step == 2
    assert req.running == 1 and req.waiting is None and req.kv_cache_usage is None  # not this half's figures
    stats.append(step(2, 999.5))
    sink = ListSink()
    assert src.poll(sink) == 1
    [stat] = sink.items
    assert isinstance(stat, StepRecord) and stat.halves == HALF_STATS and stat.request_block is None
    assert (stat.running, stat.waiting, stat.kv_cache_usage) == (2, 1, 0.25)


def test_a_figure_the_stat_logger_could_not_read_arrives_as_null(tmp_path: Path) -> None:
    w = writer(tmp_path, "decode-0", "stats", 13)
    w.append(encode_step_fields(1, 999.0, 0, 2, None, 0, None, 0, 10, 2, 0, 0, 0))
    sink = ListSink()
    RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True).poll(sink)
    (rec,) = sink.items
    assert isinstance(rec, StepRecord) and rec.halves == HALF_STATS
    assert rec.running == 2 and rec.waiting is None and rec.kv_cache_usage is None
    assert rec.preemptions == 0  # a read 0 stays 0


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
        w.append(encode_rows(n, clock.now, [Row("r", 5, n)]))
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
    w.append(encode_rows(1, 1000.0, [Row("r", 5, 5)]))
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: False)
    sink = ListSink()
    src.poll(sink)
    clock.now += 10
    src.poll(sink)
    assert [type(o) for o in sink.items] == [StepRecord]


def proc_with_listener(root: Path, pid: int, port: int, inode: int) -> Path:
    """A fake /proc: ``pid`` listens on ``port`` (a LISTEN row of net/tcp, its fd on the socket)."""
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        f"   0: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 "
        "0000000000000000 100 0 0 10 0\n"
    )
    (root / str(pid) / "fd").mkdir(parents=True)
    os.symlink(f"socket:[{inode}]", root / str(pid) / "fd" / "5")
    return root


ENGINES = [EngineConfig(name="decode-0", url="http://127.0.0.1:8000"), EngineConfig(name="prefill-0", url="http://127.0.0.1:8001")]


def test_a_ring_named_by_its_pid_joins_the_engine_listening_on_its_port(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    proc = proc_with_listener(tmp_path / "proc", 4242, 8000, 90001)
    w = writer(rings, "vllm-4242", "stats", 4242)
    w.append(step(1, 999.0))
    clock = Clock()
    src = RecorderSource(rings, clock=clock, alive=lambda pid: True, join=EngineJoin(ENGINES, proc=proc, clock=clock), join_wait=30.0)
    hub = hub_for(Settings(engines=ENGINES))
    assert src.poll(hub) == 1
    assert hub.view.last_step("decode-0") is not None and hub.view.engine("decode-0").configured
    assert hub.view.engine("vllm-4242") is None
    assert src.joined_engines() == {"decode-0"}
    assert src.figures()["engines"] == ["decode-0"] and src.figures()["unconfigured"] == []
    assert src.figures()["joined_by"] == {"decode-0": "listener"}


def test_an_unmatched_ring_waits_then_is_kept_under_its_own_name_unconfigured(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    proc = proc_with_listener(tmp_path / "proc", 4242, 8000, 90001)
    clock = Clock()
    src = RecorderSource(rings, clock=clock, alive=lambda pid: True, join=EngineJoin(ENGINES, proc=proc, clock=clock), join_wait=30.0)
    hub = hub_for(Settings(engines=ENGINES))
    w = writer(rings, "vllm-777", "stats", 777)
    w.append(step(1, 999.0))
    assert src.poll(hub) == 0  # held: a configured engine (both, here) has no recorder yet
    assert hub.view.engine("vllm-777") is None
    clock.now += 10.0
    w.append(step(2, 1009.0))
    assert src.poll(hub) == 0
    clock.now += 25.0  # past join_wait
    assert src.poll(hub) == 2  # nothing held back is lost
    st = hub.view.engine("vllm-777")
    assert [s.step for s in hub.view.steps("vllm-777")] == [1, 2] and st is not None and st.configured is False
    assert src.figures()["unconfigured"] == ["vllm-777"] and src.joined_engines() == set()
    assert hub.view.last_step("decode-0") is None


def test_a_restarted_sidecar_reports_the_same_death_with_the_same_id(tmp_path: Path) -> None:
    """The store keeps one snapshot per trigger id: a restart that reads the dead ring again must
    not make a second trigger of the same death (a new death of a new writer is a new id)."""
    w = writer(tmp_path, "decode-0", "sched", 41)
    for n in range(1, 4):
        w.append(encode_rows(n, 1000.0, [Row("r", 5, n)]))

    def report(now: float) -> list[Event]:
        clock, sink = Clock(now), ListSink()
        src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: False, silent_after=1.0)
        for _ in range(3):
            src.poll(sink)
            clock.now += 2.0
        return [o for o in sink.items if isinstance(o, Event)]

    first, again = report(1001.0), report(1030.0)
    assert [e.kind for e in first] == [e.kind for e in again] == [EventKind.RECORDER_SILENT]
    assert first[0].uid and first[0].uid == again[0].uid
    other = writer(tmp_path, "decode-0", "sched", 42)
    other.append(encode_rows(1, 1031.0, [Row("r", 5, 1)]))
    uids = {e.uid for e in report(1032.0)}
    assert len(uids) == 2 and first[0].uid in uids


def test_a_bad_ring_header_is_logged_once_not_every_poll(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    bad = tmp_path / ring_file_name("decode-0", "stats", os.getpid())
    bad.write_bytes(b"NOTARING" + b"\x00" * 4096)
    os.chmod(bad, 0o600)
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True)
    with caplog.at_level(logging.WARNING, logger="collector.sources.recorder"):
        for _ in range(40):  # two seconds of polls at 50 ms
            src.poll(ListSink())
    skipped = [r for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1 and bad.name in skipped[0].getMessage()
    bad.unlink()
    src.poll(ListSink())
    bad.write_bytes(b"NOTARING" + b"\x00" * 4096)  # a new bad file of that name is news again
    with caplog.at_level(logging.WARNING, logger="collector.sources.recorder"):
        src.poll(ListSink())
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == 2


def test_a_paired_step_counts_as_its_two_halves_in_ingest(tmp_path: Path) -> None:
    from collector.ingest.hub import hub_for
    from collector.settings import Settings

    stats = writer(tmp_path, "decode-0", "stats", 11)
    sched = writer(tmp_path, "decode-0", "sched", 12)
    for n in range(1, 4):
        stats.append(step(n, 999.0 + n))
        sched.append(encode_rows(n, 999.0 + n, [Row("r1", 300, 300, n)]))
    hub = hub_for(Settings(), clock=lambda: 1000.0)
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True)
    assert src.poll(hub) == 6
    st = hub.view.engine("decode-0")
    assert st is not None and st.steps_received == 6 and st.requests_received == 3
    held = hub.view.steps("decode-0")
    assert [s.step for s in held] == [1, 2, 3]
    assert all(s.halves == HALF_STATS | HALF_REQUESTS and s.waiting == 1 and s.request_count == 1 for s in held)


def test_far_behind_its_writer_the_step_records_are_a_counted_gap_and_events_still_arrive(tmp_path: Path) -> None:
    from collector.channel.codec import encode_event
    from collector.model import Event, EventKind

    clock = Clock()
    stats = writer(tmp_path, "decode-0", "stats", 11, capacity=1 << 16)
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: True, max_poll_records=64)
    stats.append(step(1, 1000.0))
    sink = ListSink()
    src.poll(sink)  # caught up once: from here on, falling behind is news
    assert not src.coarse and src.figures()["coarse"] == 0
    # the writer runs ahead: ~60% of the ring unread, a CUDA error in the middle of it
    n = 0
    reader = next(iter(src._tails.values())).reader
    while reader.info().head - reader.pos < 0.6 * (1 << 16):
        n += 1
        stats.append(step(1 + n, 1000.0 + n / 100))
        if n == 200:
            stats.append(encode_event(Event(kind=EventKind.CUDA_ERROR, ts=1002.0, source="recorder", message="CUDA error: an illegal memory access")))
    sink = ListSink()
    coarse_seen = False
    for _ in range(200):
        src.poll(sink)
        coarse_seen = coarse_seen or src.coarse
        if src.gaps and reader.pos >= reader.info().head:
            break
    assert coarse_seen and src.gaps == 1
    # the events came through; the steps read while far behind did not
    [cuda] = [e for e in sink.items if isinstance(e, Event) and e.kind is EventKind.CUDA_ERROR]
    [gap_event] = [e for e in sink.items if isinstance(e, Event) and "series_gap" in e.data]
    gap = gap_event.data["series_gap"]
    dropped = gap["records"]
    received = [o.step for o in sink.items if isinstance(o, StepRecord)]
    assert dropped > 0 and len(received) + dropped == n
    assert gap["from_ts"] <= gap["to_ts"] and gap["bytes"] == src.figures()["gap_bytes"] > 0
    assert gap_event.engine == "decode-0" and gap_event.severity.value == "warning"
    # the first poll's budget was read (a late reader is not yet a bound one), then steps were
    # dropped until the ring was back under the coarse line, then the newest were read
    early = list(range(2, 2 + 64))
    assert received == early + list(range(n + 2 - (len(received) - 64), n + 2))
    assert 1000.0 + 65 / 100 <= gap["from_ts"] and gap["to_ts"] < 1000.0 + (n + 2 - (len(received) - 64)) / 100
    # back under the coarse line: every step again
    stats.append(step(n + 2, 1100.0))
    sink = ListSink()
    src.poll(sink)
    assert [o.step for o in sink.items if isinstance(o, StepRecord)] == [n + 2]
    assert not src.coarse and src.figures()["gaps"] == 1


def test_a_reader_late_after_a_pause_reads_the_backlog_whole_when_its_budget_allows(tmp_path: Path) -> None:
    stats = writer(tmp_path, "decode-0", "stats", 11, capacity=1 << 16)
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True)
    stats.append(step(1, 1000.0))
    src.poll(ListSink())
    reader = next(iter(src._tails.values())).reader
    n = 0
    while reader.info().head - reader.pos < 0.7 * (1 << 16):  # the loop was held for a while
        n += 1
        stats.append(step(1 + n, 1000.0 + n / 100))
    sink = ListSink()
    src.poll(sink)
    assert [o.step for o in sink.items if isinstance(o, StepRecord)] == list(range(2, n + 2))
    assert src.gaps == 0 and not [o for o in sink.items if not isinstance(o, StepRecord)]


def ticking_clock() -> Callable[[], float]:
    """A monotonic clock each look at which is 15 ms later: a poll's budget (20 ms) covers one ring."""
    ticks = [0.0]

    def mono() -> float:
        ticks[0] += 0.015
        return ticks[0]

    return mono


def test_a_poll_reads_no_further_ring_once_its_time_is_spent_and_the_rings_take_turns(tmp_path: Path) -> None:
    mono = ticking_clock()
    a = writer(tmp_path, "a", "stats", 11)
    b = writer(tmp_path, "b", "stats", 12)
    a.append(step(1, 1000.0))
    b.append(step(1, 1000.0))
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True, monotonic=mono)
    sink = ListSink()
    src.poll(sink)  # the first catch-up of each ring is read whole, budget or not
    assert sorted(o.engine for o in sink.items if isinstance(o, StepRecord)) == ["a", "b"]
    a.append(step(2, 1001.0))
    b.append(step(2, 1001.0))
    seen: list[list[str]] = []
    for _ in range(2):
        sink = ListSink()
        src.poll(sink)
        seen.append([o.engine for o in sink.items if isinstance(o, StepRecord)])
    assert sorted(seen) == [["a"], ["b"]]  # one ring each poll, each ring in its turn
    assert all(t.short_last is False for t in src._tails.values())


def test_workload_records_reach_the_workload_log_one_batch_a_read_and_a_bad_one_is_counted(tmp_path: Path) -> None:
    from collector.channel.codec import encode_arrival, encode_end

    sched = writer(tmp_path, "decode-0", "sched", 12)
    sched.append(encode_arrival("a", 990.0, 300, 16, 1, True, False))
    sched.append(encode_arrival("b", 991.0, 200, None, None, None, None))
    sched.append(encode_arrival("c", 991.5, 100, 8, 1, False, True)[:-1] + b"\0")  # a NUL in its id
    sched.append(encode_end("a", 995.0, 16, "length", None))
    hub = hub_for(Settings(), clock=lambda: 1000.0)
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True)
    assert src.poll(hub) == 3  # the good records, handed on as one batch
    assert src.bad_records == 1 and src.records == 3
    out = hub.view.workload("decode-0", 999.0, crashed=False)
    cols = out["requests"]["columns"]
    assert cols["id"] == ["a", "b"] and cols["outcome"] == ["finished", "in_flight"]
    assert cols["max_tokens"] == [16, None] and cols["ignore_eos"] == [True, None]  # unknown is null, not 0
    assert cols["output_len"] == [16, None] and cols["finish"] == ["length", None] and cols["cached_tokens"] == [None, None]


class BatchListSink(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[Observation]] = []

    def emit_many(self, items: Sequence[Observation]) -> None:
        self.calls.append(list(items))


def test_a_poll_hands_its_records_to_a_batch_sink_in_one_call_and_its_events_after(tmp_path: Path) -> None:
    stats = writer(tmp_path, "decode-0", "stats", 11)
    sched = writer(tmp_path, "decode-0", "sched", 12)
    for n in range(1, 4):
        stats.append(step(n, 999.0 + n))
        sched.append(encode_rows(n, 999.0 + n, [Row("r1", 300, 300 + n, n)]))
    stats.append(encode({"t": "ev", "engine": "decode-0", "kind": "cuda_error", "ts": 1000.0, "message": "boom", "severity": "critical"}))
    sink = BatchListSink()
    assert RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True).poll(sink) == 7
    [records] = sink.calls
    # one read of each ring: their step halves as columns, which ingest's window merges
    assert [type(o) for o in records] == [StepHalves, StepHalves]
    halves = [o for o in records if isinstance(o, StepHalves)]
    assert [(r.step, r.halves) for r in records_of(halves)] == [(n, HALF_STATS | HALF_REQUESTS) for n in range(1, 4)]
    assert [type(o) for o in sink.items] == [Event]  # events one by one, after the records


def replaced_ring(folder: Path, engine: str, role: str, pid: int) -> RingWriter:
    """A recorder started again under the same pid (a container's, a simulator's) and a name
    without a run id (a recorder before it): the same path, a new file (``os.replace``)."""
    return writer(folder, engine, role, pid)


def test_a_ring_replaced_under_its_name_is_followed_as_a_new_run(tmp_path: Path) -> None:
    clock = Clock()
    hub = hub_for(Settings(), clock=clock)
    old = writer(tmp_path, "decode-0", "stats", 7)
    for n in range(1, 51):
        old.append(step(n, clock.now + n / 100))
    src = RecorderSource(tmp_path, clock=clock, alive=lambda pid: True)  # the same pid lives again
    src.poll(hub)
    assert [s.step for s in hub.view.steps("decode-0")][-1] == 50
    old_run = hub.view.run_info("decode-0").run
    clock.now += 3.0
    new = replaced_ring(tmp_path, "decode-0", "stats", 7)  # the old writer was SIGKILLed
    for n in range(1, 11):
        new.append(step(n, clock.now + n / 100))
    src.poll(hub)  # the old file is quiet: the path is checked and the new file followed
    src.poll(hub)
    assert src.replaced == 1
    runs = hub.view.run_info("decode-0")
    assert runs.run != old_run and runs.previous == old_run
    assert [s.step for s in hub.view.steps("decode-0")] == list(range(1, 11))  # the new run alone
    assert [s.step for s in hub.view.previous_steps("decode-0")] == list(range(1, 51))
    assert runs.previous_summary() == {"run": old_run, "ended_at": clock.now, "steps_in_ring": 50, "first_step": 1, "last_step": 50}
    # the old run's end is a trigger that names its run (its snapshot holds that run's steps)
    (death,) = [e for e in hub.view.events("decode-0", since=0.0) if e.kind == EventKind.RECORDER_SILENT]
    assert death.data["run"] == old_run and "replaced its ring" in death.message
    new.append(step(11, clock.now + 1))
    clock.now += 1.0
    src.poll(hub)
    assert hub.view.last_step("decode-0").step == 11  # type: ignore[union-attr]


def run_writer(folder: Path, engine: str, role: str, pid: int, run: int) -> RingWriter:
    w = RingWriter(folder / ring_file_name(engine, role, pid, run), capacity=1 << 16)
    w.append(encode({"t": "meta", "engine": engine, "engine_index": 0, "role": role, "pid": pid, "server_pid": pid, "run": run}))
    return w


@pytest.mark.parametrize("reversed_order", [False, True])
def test_rings_named_by_their_run_keep_the_runs_apart_whatever_order_they_are_read(tmp_path: Path, reversed_order: bool) -> None:
    # both runs' files are in the folder when the sidecar starts: the newer start time is current
    first, second = 1_765_000_000_000, 1_765_000_030_000
    old = run_writer(tmp_path, "vllm-1", "stats", 1, first)
    new = run_writer(tmp_path, "vllm-1", "stats", 1, second)
    for n in range(1, 31):
        old.append(step(n, 900.0 + n))
    for n in range(1, 6):
        new.append(step(n, 990.0 + n))
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True)
    src._polls = 0 if reversed_order else 1  # which ring starts the poll
    hub = hub_for(Settings(), clock=lambda: 1000.0)
    src.poll(hub)
    runs = hub.view.run_info("vllm-1")
    assert (runs.run, runs.previous) == (second, first)
    assert [s.step for s in hub.view.steps("vllm-1")] == [1, 2, 3, 4, 5]
    assert [s.step for s in hub.view.previous_steps("vllm-1")] == list(range(1, 31))


def test_a_ring_is_read_every_read_every_seconds_or_at_once_for_a_capture_or_a_writer_gone(tmp_path: Path) -> None:
    clock, mono, alive = Clock(), Clock(0.0), [True]
    w = writer(tmp_path, "decode-0", "stats", 41)
    w.append(step(1, clock.now))
    src = RecorderSource(tmp_path, clock=clock, monotonic=mono, alive=lambda pid: alive[0], read_every=0.5)
    sink = ListSink()
    assert src.poll(sink) == 1  # the first catch-up (step 1), at once

    def steps() -> list[int]:
        return [o.step for o in sink.items if isinstance(o, StepRecord)]

    w.append(step(2, clock.now))
    mono.now += 0.1
    assert src.poll(sink) == 0 and steps() == [1]  # too soon after the last read: the header alone
    mono.now += 0.2
    w.append(step(3, clock.now))
    assert src.poll(sink) == 0
    mono.now += 0.25  # read_every since the last read: both waiting steps at once
    assert src.poll(sink) == 2 and steps() == [1, 2, 3]

    w.append(step(4, clock.now))
    mono.now += 0.1
    assert src.poll(sink, everything=True) == 1 and steps() == [1, 2, 3, 4]  # a snapshot's capture reads now

    w.append(step(5, clock.now))
    mono.now += 0.1
    assert src.poll(sink) == 0  # the head moved: the writer is alive
    alive[0] = False
    mono.now += 0.1
    assert src.poll(sink) == 1 and steps()[-1] == 5  # head still, writer gone: its last records now


def test_a_ring_with_a_full_poll_of_records_waiting_is_read_before_read_every(tmp_path: Path) -> None:
    clock, mono = Clock(), Clock(0.0)
    w = writer(tmp_path, "decode-0", "stats", 42)
    w.append(step(1, clock.now))
    src = RecorderSource(tmp_path, clock=clock, monotonic=mono, alive=lambda pid: True, read_every=10.0, poll_bytes=4096)
    sink = ListSink()
    src.poll(sink)
    w.append(step(2, clock.now))
    mono.now += 0.1
    assert src.poll(sink) == 0  # one step waiting: not yet
    for n in range(3, 200):
        w.append(step(n, clock.now))
    mono.now += 0.1
    assert src.poll(sink) > 0  # past poll_bytes unread: read now, not 10 s after the last read


def test_a_capture_reads_every_ring_up_to_its_head_whatever_the_poll_budget(tmp_path: Path) -> None:
    mono = ticking_clock()
    a = writer(tmp_path, "a", "stats", 11)
    b = writer(tmp_path, "b", "stats", 12)
    a.append(step(1, 1000.0))
    b.append(step(1, 1000.0))
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True, monotonic=mono, read_every=0.5)
    src.poll(ListSink())  # the first catch-ups
    a.append(step(2, 1001.0))
    b.append(step(2, 1001.0))
    sink = ListSink()
    src.poll(sink, everything=True)  # a trigger's read before its capture: both rings, budget spent or not
    assert sorted(o.engine for o in sink.items if isinstance(o, StepRecord)) == ["a", "b"]


def test_a_small_ring_is_read_before_its_writer_can_lap_it(tmp_path: Path) -> None:
    clock, mono = Clock(), Clock(0.0)
    w = writer(tmp_path, "decode-0", "stats", 43, capacity=1 << 14)  # 16 KiB: read once 1 KiB waits
    w.append(step(1, clock.now))
    src = RecorderSource(tmp_path, clock=clock, monotonic=mono, alive=lambda pid: True, read_every=10.0)
    sink = ListSink()
    src.poll(sink)
    w.append(step(2, clock.now))
    mono.now += 0.1
    assert src.poll(sink) == 0  # a step waiting: not yet
    for n in range(3, 40):
        w.append(step(n, clock.now))
    mono.now += 0.1
    assert src.poll(sink) > 0 and src.lost_bytes == 0  # an eighth of its size half full: read now


def test_request_blocks_stay_in_their_ring_and_a_capture_copies_them_out(tmp_path: Path) -> None:
    """The window keeps each step's request block as its place in the ring (the ring holds it
    several times longer); a snapshot's capture copies the bytes out, so what it froze stands
    while the writer goes on; a block the ring overwrote before a capture is counted, not read
    as other rows."""
    from collector.channel.blocks import RequestBlock
    from collector.ingest.window import HeldSteps
    from collector.snapshot.freeze import capture

    sched = writer(tmp_path, "decode-0", "sched", 12, capacity=1 << 14)
    rows = [[Row(f"r{n}-{i}", 300, 300 + n, n) for i in range(20)] for n in range(1, 4)]
    for n in range(1, 4):
        sched.append(encode_rows(n, 999.0 + n, rows[n - 1]))
    hub = hub_for(Settings(), clock=lambda: 1000.0)
    src = RecorderSource(tmp_path, clock=Clock(), alive=lambda pid: True)
    assert src.poll(hub) == 3
    held = hub.view.steps("decode-0")
    assert [s.step for s in held] == [1, 2, 3]
    blocks = [s.request_block for s in held]
    assert all(isinstance(b, RequestBlock) and not b.held for b in blocks)  # places, not bytes
    trigger = Event(kind=EventKind.XID, ts=1003.0, source="kmsg", message="Xid 43", severity=Severity.CRITICAL, engine="decode-0")
    first = capture(hub.view, "decode-0", trigger, gpu_seconds=60.0)
    assert all(isinstance(s.request_block, RequestBlock) and s.request_block.held for s in first.steps)
    for n in range(4, 40):  # the writer goes on and laps the ring
        sched.append(encode_rows(n, 999.0 + n, rows[0]))
    doc = first.build()
    assert doc.requests.columns["request_id"] == [r.request_id for rs in rows for r in rs]
    assert "request_blocks_lost" not in doc.summary
    # a capture of the steps the ring no longer holds: their figures, without their rows
    held_steps = hub.view.steps("decode-0")
    assert isinstance(held_steps, HeldSteps)
    again = capture(hub.view, "decode-0", trigger, gpu_seconds=60.0)
    assert isinstance(again.steps, HeldSteps) and again.steps._built is None  # records built by the build, off the loop
    later = again.build()
    assert later.summary["request_blocks_lost"] == 3
    assert later.requests.columns["request_id"] == [] and len(later.requests) == 0
    assert [(s["step"], s["requests"], s["has_requests"]) for s in later.steps][:3] == [(1, 20, True), (2, 20, True), (3, 20, True)]
    assert "requests_at_last_step" not in later.summary


def test_a_ring_the_sidecar_deletes_or_that_was_replaced_lets_its_file_go(tmp_path: Path) -> None:
    """A block keeps its ring's file open: a ring deleted after its engine's death lets it go at
    once (its tmpfs space with it), a replaced one after RELEASE_AFTER_S (its death's capture
    reads its blocks first)."""
    from collector.channel.blocks import RequestBlock
    from collector.sources.recorder import RELEASE_AFTER_S

    clock, mono = Clock(), Clock(0.0)
    w = writer(tmp_path, "decode-0", "sched", 12)
    w.append(encode_rows(1, 999.0, [Row("r1", 300, 300, 1)]))
    hub = hub_for(Settings(), clock=lambda: 1000.0)
    src = RecorderSource(tmp_path, clock=clock, monotonic=mono, alive=lambda pid: False, keep_dead_for=10.0)
    src.poll(hub)
    [step] = hub.view.steps("decode-0")
    block = step.request_block
    assert isinstance(block, RequestBlock) and not block.held and block.parts() is not None
    clock.now += 2.0
    src.poll(hub)  # silent: its death reported
    clock.now += 20.0
    src.poll(hub)  # past keep_dead_for: deleted
    assert not (tmp_path / w.path.name).exists()
    assert block.parts() is None and block.resident().gone

    other = writer(tmp_path, "decode-1", "sched", 13)
    other.append(encode_rows(1, 1021.0, [Row("r2", 300, 300, 1)]))
    src.alive = lambda pid: True
    src.poll(hub)
    [step] = hub.view.steps("decode-1")
    kept = step.request_block
    assert isinstance(kept, RequestBlock) and kept.parts() is not None
    src.forget("decode-1")
    assert kept.parts() is not None  # a grace to capture from
    mono.now += RELEASE_AFTER_S + 1
    src.poll(hub)
    assert kept.parts() is None
