"""The sidecar's log lines about its engines: none watched, not answering, answering again, each
said once per change (ingest/reach.py)."""

from __future__ import annotations

from collector.ingest.reach import NO_ENGINES, ReachLog

URLS = {"decode-0": "http://127.0.0.1:8001", "prefill-0": "http://127.0.0.1:8002"}


def test_no_engines_is_said_once_and_engines_appearing_later_are_named() -> None:
    log = ReachLog()
    assert log.check({}, {}, 0.0) == [NO_ENGINES]
    assert log.check({}, {}, 5.0) == []
    assert log.check({"decode-0": True}, URLS, 10.0) == ["now watching 1 engine(s): decode-0"]


def test_an_engine_that_never_answers_is_named_after_the_grace_then_each_change_once() -> None:
    log = ReachLog(grace_s=15.0)
    assert log.check({"decode-0": None, "prefill-0": True}, URLS, 0.0) == []  # too early to say
    late = log.check({"decode-0": None, "prefill-0": True}, URLS, 20.0)
    assert len(late) == 1 and late[0].startswith("engine decode-0 at http://127.0.0.1:8001 has not answered /metrics in the 20 s")
    assert log.check({"decode-0": None, "prefill-0": True}, URLS, 25.0) == []  # said once
    assert log.check({"decode-0": True, "prefill-0": True}, URLS, 30.0) == ["engine decode-0 at http://127.0.0.1:8001 answers /metrics now"]
    down = log.check({"decode-0": True, "prefill-0": False}, URLS, 35.0)
    assert down == ["engine prefill-0 at http://127.0.0.1:8002 does not answer /metrics: no steps or scrapes recorded for it until it does"]
    assert log.check({"decode-0": True, "prefill-0": False}, URLS, 40.0) == []
    assert log.check({"decode-0": True, "prefill-0": True}, URLS, 45.0) == ["engine prefill-0 at http://127.0.0.1:8002 answers /metrics now"]
