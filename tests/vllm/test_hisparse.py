"""The stateful per-step readers (``RequestColumns``, ``MirrorRows``, ``HostBlocks``) against
the readers that re-read everything at every step (reference_readers.py): over stand-ins shaped
like vLLM 0.32's Request, SparseKVRowMirror and host manager, through requests joining,
finishing, preempted and resumed, host blocks growing (null blocks among them), a request's
first host block, steps without HiSparse metadata and metadata of every shape, the columns are
the same bytes at every step. The same readers run on vLLM's real classes in
test_hisparse_real.py."""

from __future__ import annotations

import enum
import random
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from reference_readers import host_blocks_column, mirror_rows_column, request_columns  # tests/vllm is on sys.path

from collector.vllm.extract import RequestColumns
from collector.vllm.hisparse import HostBlocks, MirrorRows, i32_column, row_mirrors_of


class Status(enum.IntEnum):
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3


class Req:
    """Plain attributes, as vLLM's Request has them."""

    def __init__(self, rid: str, prompt: int) -> None:
        self.request_id = rid
        self.num_prompt_tokens = prompt
        self.num_computed_tokens = 0
        self._output_token_ids: list[int] = []
        self.num_preemptions = 0
        self.status = Status.RUNNING


@dataclass(frozen=True)
class Mirror:
    source_starts: tuple[int, ...]
    destination_start: int
    num_rows: int


@dataclass(eq=False)
class Block:
    block_id: int
    is_null: bool = False


NULL = Block(0, is_null=True)


class Engine:
    """A scheduler's running list and a host manager's ``req_to_blocks``, moved at random the
    ways vLLM moves them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.running: list[Req] = []
        self.waiting: list[Req] = []
        self.req_to_blocks: defaultdict[str, list[Block]] = defaultdict(list)
        manager = SimpleNamespace(req_to_blocks=self.req_to_blocks)
        self.connector = SimpleNamespace(connector_scheduler=SimpleNamespace(coordinator=SimpleNamespace(host_manager=manager)))
        self.count = 0
        self.preempted = False

    def new_request(self) -> Req:
        self.count += 1
        return Req(f"cmpl-{self.count:08x}-0-{self.rng.getrandbits(32):08x}", self.rng.randrange(1, 5000))

    def free(self, r: Req) -> None:
        self.req_to_blocks.pop(r.request_id, None)  # vLLM pops the list whole

    def grow(self, r: Req, k: int) -> None:
        # allocate_new_blocks / add_local_computed_blocks: the list only grows
        self.req_to_blocks[r.request_id].extend(NULL if self.rng.random() < 0.2 else Block(self.rng.randrange(1, 10**6)) for _ in range(k))

    def step(self) -> dict[str, Any] | None:
        """One schedule(): events, then a decode of every running request; returns the step's
        row_mirrors (None: no HiSparse metadata)."""
        rng = self.rng
        self.preempted = False
        if rng.random() < 0.3:  # requests join (new, appended to running)
            for _ in range(rng.randrange(1, 4)):
                r = self.new_request()
                self.running.append(r)
                if rng.random() < 0.7:
                    self.grow(r, rng.randrange(0, 40))
        if self.running and rng.random() < 0.2:  # one finishes
            r = self.running.pop(rng.randrange(len(self.running)))
            self.free(r)
        if self.running and rng.random() < 0.1:  # the last one is preempted
            r = self.running.pop()
            r.status, r.num_preemptions, r.num_computed_tokens = Status.PREEMPTED, r.num_preemptions + 1, 0
            self.free(r)
            self.waiting.append(r)
            self.preempted = True
        elif self.waiting and rng.random() < 0.2:  # a preempted one resumes
            r = self.waiting.pop(0)
            r.status = Status.RUNNING
            self.running.append(r)
            self.grow(r, rng.randrange(1, 10))
        for r in self.running:  # decode (sometimes a chunk)
            r.num_computed_tokens += rng.choice([1, 1, 1, 64])
            r._output_token_ids.append(7)
            if rng.random() < 0.05:
                self.grow(r, rng.randrange(1, 3))
        if rng.random() < 0.15:
            return None
        shape = rng.choice(["one", "two", "mixed", "some unscheduled", "reordered"])
        rows: dict[str, Any] = {}
        for r in self.running:
            width = {"one": 1, "two": 2}.get(shape, rng.randrange(0, 4))
            if shape == "some unscheduled" and rng.random() < 0.3:
                continue
            rows[r.request_id] = tuple(Mirror((0,), 0, rng.randrange(0, 65)) for _ in range(width))
        if shape == "reordered":
            items = list(rows.items())
            rng.shuffle(items)
            rows = dict(items)
        return rows


def test_the_stateful_readers_write_what_rereading_everything_writes() -> None:
    for seed in range(8):
        eng = Engine(seed)
        cols, mirrors, host = RequestColumns(), MirrorRows(), HostBlocks(eng.connector)
        for _ in range(300):
            row_mirrors = eng.step()
            computed, output = cols.read(eng.running, changed=eng.preempted)
            ids = cols.id_list
            ref = request_columns(eng.running)
            got = {"ids": cols.ids, "prompt": cols.prompt, "computed": computed, "output": output, "preempt": cols.preempt, "status": cols.status}
            assert got == ref
            assert mirrors.column(ids, row_mirrors) == mirror_rows_column(ids, row_mirrors)
            assert host.column(ids) == host_blocks_column(eng.req_to_blocks, ids)
        assert eng.count > 20 and eng.waiting is not None


def test_host_blocks_follow_a_growing_list_and_a_first_block() -> None:
    eng = Engine(0)
    a, b = eng.new_request(), eng.new_request()
    eng.running[:] = [a, b]
    eng.req_to_blocks[a.request_id].extend([Block(1), Block(2), Block(3)])
    cols, host = RequestColumns(), HostBlocks(eng.connector)
    cols.read(eng.running)
    ids = cols.id_list
    first = host.column(ids)
    assert first == host_blocks_column(eng.req_to_blocks, ids)
    assert host.column(ids) is first  # nothing moved: the same column, not rebuilt
    assert b.request_id not in eng.req_to_blocks  # looked up with .get: never inserted
    eng.req_to_blocks[a.request_id].extend([Block(9), NULL])  # grows by one real and one null block
    eng.req_to_blocks[b.request_id].append(Block(8))  # b's first block
    assert host.column(ids) == host_blocks_column(eng.req_to_blocks, ids) == i32_column([4, 1])


def test_a_list_that_shrinks_while_another_grows_is_not_hidden_by_the_total() -> None:
    # vLLM 0.32's lists only grow; a vLLM that truncates one while another grows by as much
    # keeps the total: once a list is seen shorter, every length is compared
    eng = Engine(0)
    a, b = eng.new_request(), eng.new_request()
    eng.running[:] = [a, b]
    eng.req_to_blocks[a.request_id].extend([Block(1), Block(2), Block(3)])
    eng.req_to_blocks[b.request_id].extend([Block(4), Block(5), Block(6)])
    cols, host = RequestColumns(), HostBlocks(eng.connector)
    cols.read(eng.running)
    ids = cols.id_list
    assert host.column(ids) == host.column(ids) == i32_column([3, 3])  # quiet: the sum's shortcut
    eng.req_to_blocks[b.request_id].pop()  # shorter: seen, as the total moved
    assert host.column(ids) == host_blocks_column(eng.req_to_blocks, ids) == i32_column([3, 2])
    assert host.column(ids) == i32_column([3, 2])
    eng.req_to_blocks[a.request_id].append(Block(7))  # one grows while the other shrinks: the same total
    eng.req_to_blocks[b.request_id].pop()
    assert host.column(ids) == host_blocks_column(eng.req_to_blocks, ids) == i32_column([4, 1])


def test_no_coordinator_yet_is_unknown_then_counted_once_bound() -> None:
    eng = Engine(1)
    r = eng.new_request()
    eng.running[:] = [r]
    eng.grow(r, 2)
    coordinator = eng.connector.connector_scheduler.coordinator
    eng.connector.connector_scheduler.coordinator = None
    cols, host = RequestColumns(), HostBlocks(eng.connector)
    cols.read(eng.running)
    assert host.column(cols.id_list) == i32_column([-1])
    eng.connector.connector_scheduler.coordinator = coordinator  # bind_coordinator
    assert host.column(cols.id_list) == i32_column([2 - sum(b.is_null for b in eng.req_to_blocks[r.request_id])])


def test_mirror_rows_of_every_shape() -> None:
    ids = ["a", "b", "c"]
    m = MirrorRows()
    one = {"a": (Mirror((0,), 0, 3),), "b": (Mirror((0,), 0, 1),), "c": (Mirror((0,), 0, 2),)}
    two = {k: (Mirror((0,), 0, 1), Mirror((64,), 1, 4)) for k in ids}
    mixed = {"a": (), "b": (Mirror((0,), 0, 1), Mirror((0,), 0, 2), Mirror((0,), 0, 3)), "c": (Mirror((0,), 0, 5),)}
    partial = {"c": (Mirror((0,), 0, 5),), "a": (Mirror((0,), 0, 1),)}  # b not scheduled, another order
    for rows in (one, two, one, mixed, partial, None, two, {}):
        assert m.column(ids, rows) == mirror_rows_column(ids, rows)
    assert m.column(ids, two) == i32_column([5, 5, 5]) and m.column(ids, None) == i32_column([-1, -1, -1])


def test_rows_of_finds_what_row_mirrors_of_finds_as_the_metadata_changes_shape() -> None:
    rows_a = {"a": (Mirror((0,), 0, 1),)}
    rows_b = {"b": (Mirror((0,), 0, 2),)}
    direct = SimpleNamespace(row_mirrors=rows_a)
    other = SimpleNamespace(kv_lease=1)  # another connector's metadata: no row_mirrors
    multi = SimpleNamespace(metadata=(other, SimpleNamespace(row_mirrors=rows_b)))
    moved = SimpleNamespace(metadata=(SimpleNamespace(row_mirrors=rows_a), other))  # same type, another place
    shorter = SimpleNamespace(metadata=(other,))
    m = MirrorRows()
    for meta in (multi, multi, moved, direct, None, multi, shorter, multi, SimpleNamespace(metadata=None), direct, direct):
        assert m.rows_of(meta) is row_mirrors_of(meta)
