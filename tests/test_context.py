"""/healthz's database state: a statement waiting past the server's own timeout, or one the
watchdog had to cut with no write succeeding since, is a database that is down (hung), even
while the writer's own last write looked fine."""

from __future__ import annotations

import time

from collector.storage.connect import hang_watchdog
from tests.api.api_context import make_context

PG = "postgresql+psycopg://postgres@127.0.0.1:1/none"  # never connected to: the watchdog is what is read


def test_a_statement_waiting_past_the_servers_timeout_is_a_hung_database() -> None:
    ctx = make_context(PG)
    ctx.writer.db_up, ctx.writer.last_ok = True, time.time()
    dog = hang_watchdog(ctx.repo.db)
    assert dog is not None
    assert ctx.health()["database_up"] is True
    dog.clock = lambda: 100.0
    dog._armed[1] = (94.0, -1)  # noqa: SLF001 - a statement sent 6 s ago, unanswered
    h = ctx.health()
    assert h["database_up"] is False and h["status"] == "degraded" and "is hung" in h["database_error"]
    dog._armed.clear()  # noqa: SLF001
    assert ctx.health()["database_up"] is True


def test_a_cut_statement_means_down_until_a_write_succeeds() -> None:
    ctx = make_context(PG)
    dog = hang_watchdog(ctx.repo.db)
    assert dog is not None
    ctx.writer.db_up, ctx.writer.last_ok = True, time.time() - 10
    dog.last_shut = time.time() - 1  # the writer may still wait on a connection that has not failed yet
    h = ctx.health()
    assert h["database_up"] is False and "cut" in h["database_error"]
    ctx.writer.last_ok = time.time()  # a write went through since
    assert ctx.health()["database_up"] is True
