"""The wedge watch over a real hub (ingest as the service wires it), on a clock the test moves:
steps and scrapes filed as the sources file them, one tick a second."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from collector.detectors.config import WedgeThresholds
from collector.detectors.wedge_watch import WedgeWatch
from collector.ingest.hub import Hub, hub_for
from collector.model import HALF_STATS, Event, EventKind, MetricsScrape, Severity, StepRecord
from collector.settings import EngineConfig, Settings

T0 = 1_796_000_000.0
ENGINE = "decode-0"


class Rig:
    def __init__(self, thr: WedgeThresholds | None = None, *, scrape_interval_s: float = 1.0) -> None:
        self.now = T0
        self.hub: Hub = hub_for(Settings(engines=[EngineConfig(name=ENGINE, url="http://d")]), clock=lambda: self.now)
        self.events: list[Event] = []
        self.behind = False
        self.watch = WedgeWatch(self.hub.view, self._emit, thr or WedgeThresholds(), scrape_interval_s=scrape_interval_s, behind=lambda: self.behind)
        self.step = 0

    def _emit(self, ev: Event) -> None:
        self.events.append(ev)
        self.hub.emit(ev)

    def steps(self, until: float, *, every: float, held: Callable[[float], int] = lambda t: 8) -> None:
        """Steps every ``every`` seconds up to ``until`` (seconds after T0), a tick each second."""
        t = self.now - T0
        next_step = t + every
        while t < until:
            t = round(t + 0.05, 6)
            if t >= next_step - 1e-9:
                self.step += 1
                h = held(t)
                self.hub.emit(StepRecord(engine=ENGINE, ts=T0 + t, step=self.step, running=h, waiting=0, halves=HALF_STATS))
                next_step += every
            self.at(t)

    def at(self, t: float) -> None:
        """Moves the clock to ``t``, ticking once at each whole second passed."""
        while self.now < T0 + t - 1e-9:
            whole = (int((self.now - T0) + 1e-9) + 1) if abs((self.now - T0) - round(self.now - T0)) < 1e-9 else int(self.now - T0) + 1
            self.now = min(T0 + whole, T0 + t)
            if abs((self.now - T0) - round(self.now - T0)) < 1e-9:
                self.watch.tick()

    def state(self) -> str:
        st = self.hub.view.engine_state(ENGINE)
        assert st is not None
        return st.state

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.events]


def test_requests_held_and_steps_stopped_is_one_wedge_within_the_floor_then_its_end() -> None:
    rig = Rig()
    rig.steps(20.0, every=0.1)
    assert rig.state() == "ok" and rig.kinds() == []
    last_step_ts = T0 + 20.0
    rig.at(60.0)  # the step that never ends
    assert rig.kinds() == ["engine_wedged"]
    wedge = rig.events[0]
    assert wedge.engine == ENGINE and wedge.severity is Severity.CRITICAL
    assert 10.0 <= wedge.ts - last_step_ts <= 11.0  # the floor, within a tick
    assert wedge.data["held"] == 8 and wedge.data["last_step"] == rig.step and wedge.data["from"] == "recorder"
    assert wedge.data["last_step_ts"] == pytest.approx(last_step_ts, abs=0.01)
    st = rig.hub.view.engine_state(ENGINE)
    assert st is not None and st.state == "wedged" and not st.healthy
    assert st.since == pytest.approx(last_step_ts, abs=0.01)  # wedged since its last step
    assert rig.watch.wedged() == {ENGINE: True}
    assert rig.watch.seconds_since_step()[ENGINE] == pytest.approx(40.0, abs=0.1)
    rig.steps(70.0, every=0.1)  # it moves again
    assert rig.kinds() == ["engine_wedged", "engine_resumed"]
    resumed = rig.events[1]
    assert 40.1 <= resumed.data["stuck_s"] <= 41.1  # from its last step to the newest step the next tick sees
    assert resumed.data["wedged_uid"] == wedge.uid
    assert rig.state() == "ok" and rig.watch.wedged() == {ENGINE: False}
    assert rig.watch.seconds_since_step()[ENGINE] < 1.0


def test_slow_prefill_like_steps_are_its_pace_not_a_hang() -> None:
    rig = Rig()
    rig.steps(120.0, every=8.0, held=lambda t: 1)  # one long chunk every 8 s
    rig.at(145.0)  # a gap of 25 s: under 4 x 8 s
    assert rig.kinds() == []
    assert rig.state() == "ok"
    rig.at(160.0)  # 40 s: past 32 s
    assert rig.kinds() == ["engine_wedged"]
    assert rig.events[0].data["threshold_s"] == pytest.approx(32.0, abs=0.2)


def test_a_wedge_is_no_pace_the_next_one_is_seen_as_fast() -> None:
    rig = Rig()
    rig.steps(20.0, every=0.1)
    rig.at(80.0)
    rig.steps(100.0, every=0.1)
    rig.at(140.0)
    assert rig.kinds() == ["engine_wedged", "engine_resumed", "engine_wedged"]
    assert rig.events[2].data["threshold_s"] == pytest.approx(10.0)  # the 60 s stop did not become its pace


def test_an_idle_engine_is_never_wedged() -> None:
    rig = Rig()
    rig.steps(10.0, every=0.1, held=lambda t: 8 if t < 9 else 0)  # its last step finished everything
    rig.at(3600.0)
    assert rig.kinds() == []
    assert rig.state() == "idle"
    assert rig.watch.seconds_since_step()[ENGINE] == 0.0


def test_requests_that_arrive_after_a_long_idle_start_the_clock_afresh() -> None:
    rig = Rig()
    rig.steps(10.0, every=0.1, held=lambda t: 0)
    rig.at(500.0)
    rig.steps(505.0, every=0.1)  # busy again: its last step before was 495 s ago
    rig.at(512.0)
    assert rig.kinds() == []


def _scrape(rig: Rig, t: float, *, tokens: float, running: float, awake: float | None = None, paused: bool | None = None) -> None:
    values = {"num_requests_running": running, "num_requests_waiting": 0.0, "generation_tokens_total": tokens, "prompt_tokens_total": 100.0}
    if awake is not None:
        values['engine_sleep_state{sleep_state="awake"}'] = awake
    rig.hub.emit(MetricsScrape(engine=ENGINE, ts=T0 + t, values=values, paused=paused))


def test_an_engine_without_the_recorder_wedges_on_frozen_counters_and_resumes_when_they_move() -> None:
    rig = Rig()
    for s in range(1, 61):  # counters move for 20 s, then stand still with 4 running (vLLM's frozen /metrics)
        _scrape(rig, s, tokens=float(min(s, 20) * 50), running=4.0)
        rig.at(s)
    assert rig.kinds() == ["engine_wedged"]
    wedge = rig.events[0]
    assert wedge.data["from"] == "metrics" and wedge.data["held"] == 4
    assert 10.0 <= wedge.ts - (T0 + 20) <= 11.0
    _scrape(rig, 61, tokens=2000.0, running=4.0)
    rig.at(61)
    assert rig.kinds() == ["engine_wedged", "engine_resumed"]
    assert rig.state() == "ok"


def test_an_engine_put_to_sleep_is_asleep_not_wedged() -> None:
    rig = Rig()
    for s in range(1, 121):  # vLLM's sleep gauge says awake 0; its gauges still say 2 running
        _scrape(rig, s, tokens=500.0, running=2.0, awake=0.0)
        rig.at(s)
    assert rig.kinds() == []
    assert rig.state() == "sleeping"


def test_an_engine_vllm_paused_holds_its_requests_without_being_wedged_and_is_judged_afresh_after() -> None:
    rig = Rig()
    for s in range(1, 121):  # paused from 10 s (RL weight update): counters still, /is_paused says so
        still = s >= 10
        _scrape(rig, s, tokens=float(min(s, 10) * 50), running=4.0, paused=True if still and s > 10 else None)
        rig.at(s)
    assert rig.kinds() == []
    assert rig.state() == "paused"
    for s in range(121, 126):  # resumed: it steps again
        _scrape(rig, s, tokens=float(s * 50), running=4.0)
        rig.at(s)
    assert rig.state() == "ok"
    for s in range(126, 150):  # then it stops, and is not paused: a wedge, timed from its last step
        _scrape(rig, s, tokens=125 * 50.0, running=4.0, paused=False if s > 126 else None)
        rig.at(s)
    assert rig.kinds() == ["engine_wedged"]
    assert 10.0 <= rig.events[0].ts - (T0 + 125) <= 11.0


def test_a_down_engine_is_down_not_wedged_and_a_gpu_fault_is_its_own_state() -> None:
    rig = Rig()
    rig.steps(20.0, every=0.1)
    rig.hub.emit(
        Event(kind=EventKind.ENGINE_DOWN, ts=T0 + 21, source="scrape", message="3 failed scrapes", severity=Severity.CRITICAL, engine=ENGINE)
    )
    rig.at(60.0)
    assert rig.kinds() == []
    st = rig.hub.view.engine_state(ENGINE)
    assert st is not None and st.state == "down" and not st.healthy
    rig.steps(80.0, every=0.1)  # back (a restart)
    assert rig.state() == "ok"
    rig.hub.emit(
        Event(
            kind=EventKind.XID,
            ts=T0 + 80.5,
            source="kmsg",
            message="NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus",
            severity=Severity.CRITICAL,
            engine=ENGINE,
            xid=79,
        )
    )
    st = rig.hub.view.engine_state(ENGINE)
    assert st is not None and st.state == "gpu_fault" and not st.healthy and "Xid" in st.reason
    assert st.since == pytest.approx(T0 + 80.5)


def test_no_judgement_while_the_sidecar_itself_is_behind() -> None:
    rig = Rig()
    rig.steps(20.0, every=0.1)
    rig.behind = True
    rig.at(60.0)
    assert rig.kinds() == [] and rig.watch.skipped >= 40
    rig.behind = False
    rig.at(61.0)
    assert rig.kinds() == ["engine_wedged"]


def test_disabled_the_watch_says_nothing() -> None:
    rig = Rig(WedgeThresholds(enabled=False))
    rig.steps(20.0, every=0.1)
    rig.at(200.0)
    assert rig.kinds() == []


def test_one_long_step_among_quick_ones_between_two_ticks_is_still_seen_as_its_pace() -> None:
    rig = Rig()
    rig.steps(20.0, every=0.1)
    rig.at(29.0)  # a 9 s prefill step: no movement for 9 ticks ...
    rig.steps(40.0, every=0.1)  # ... then quick decode steps again, several between two ticks
    rig.at(65.0)  # 25 s without a step: under 4 x 9 s
    assert rig.kinds() == []
    rig.at(80.0)
    assert rig.kinds() == ["engine_wedged"]
    assert rig.events[0].data["longest_gap_s"] == pytest.approx(9.0, abs=1.0)


def test_a_state_is_dated_when_it_changed_not_when_it_was_first_asked() -> None:
    rig = Rig()
    rig.steps(20.0, every=0.1, held=lambda t: 8 if t < 15 else 0)  # idle from 15 s
    rig.at(100.0)
    st = rig.hub.view.engine_state(ENGINE)
    assert st is not None and st.state == "idle" and st.since is not None
    assert st.since - T0 <= 16.0  # the tick after its last busy step, not 100 s when first asked


def _arrive(rig: Rig, t: float, rid: str) -> None:
    from collector.model import WorkloadArrival, WorkloadBatch

    rig.hub.emit(WorkloadBatch(engine=ENGINE, ts=T0 + t, records=[WorkloadArrival(rid, T0 + t, 100, 16, 1, False, False)]))


def test_a_hang_in_the_first_step_after_idle_is_seen_from_the_requests_its_api_server_accepted() -> None:
    rig = Rig()
    rig.steps(10.0, every=0.1, held=lambda t: 8 if t < 9 else 0)  # idle from 9 s: its last step held nothing
    rig.at(100.0)
    _arrive(rig, 100.2, "cmpl-a")  # accepted; the first step never ends, so no step says it holds it
    rig.at(120.0)
    assert rig.kinds() == ["engine_wedged"]
    wedge = rig.events[0]
    assert wedge.data["held"] == 1 and 10.0 <= wedge.ts - (T0 + 100.2) <= 11.0


def test_requests_accepted_and_stepped_are_no_wedge() -> None:
    rig = Rig()
    rig.steps(10.0, every=0.1, held=lambda t: 0)
    rig.at(100.0)
    _arrive(rig, 100.2, "cmpl-b")
    rig.steps(103.0, every=0.1, held=lambda t: 1 if t < 102 else 0)  # stepped it, finished it
    rig.at(200.0)
    assert rig.kinds() == []
