"""Internal: ``RequestRecorder``: the running requests of one engine step (one binary ``R`` record per
call), and the workload records a replay is built from (``W`` arrive/end, once per request).

What vLLM's ``RecordingScheduler`` writes through; any other engine or a load simulator writes
the same way. Columns go in as ``bytes`` of an ``array`` (what a hot path builds with ``map``
over ``attrgetter``, no per-row objects) or as any iterable of ints::

    rec = RequestRecorder(EngineIdentity(server_pid=os.getpid(), server_port=8000))
    rec.write_requests(812, n=2, ids=["cmpl-a-0", "cmpl-b-0"], prompt_len=[32000, 300],
                       computed=[32512, 300], output=[512, 0], preemptions=[0, 1],
                       status=[status_code("running")] * 2, mirror_rows=[8, -1])
    rec.write_arrival("cmpl-a-0", ts=arrival, prompt_len=32000, max_tokens=2000, n=1,
                      ignore_eos=True, has_stop=False)
    rec.write_end("cmpl-a-0", output_len=2000, finish="length", cached_tokens=None)

``mirror_rows`` (host-mirror rows the HiSparse connector scheduled for the request this step)
and ``host_blocks`` (host blocks the HiSparse coordinator holds for it) are optional columns:
None leaves the column out (the engine has no such connector), -1 marks one unknown row.

Only what changed is written: while the running set holds (the same ids, prompt lengths,
preemptions and statuses as the last full record), a record carries the step's computed and
output counts and the optional columns, and keeps the rest (``collector.channel.codec``, ``R``).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from typing import Any, TypeAlias

from collector.channel.wire import (
    FLAG_HOST_BLOCKS,
    FLAG_KEPT,
    FLAG_MIRROR,
    KEPT_MAX,
    REQS_HEAD,
    STATUS_CODE,
    TAG_REQS,
    UNKNOWN_STATUS,
    encode_arrival,
    encode_end,
)
from collector.recorder.base import RecorderBase
from collector.recorder.channel import SCHED_RING_BYTES

__all__ = ["SCHED_RING_BYTES", "Column", "RequestRecorder", "status_code"]

_HEAD = struct.Struct("<c" + REQS_HEAD.format.lstrip("<"))  # the tag and the head in one pack
Column: TypeAlias = "bytes | array[int] | Iterable[int]"  # array[int] is not subscriptable at runtime
FINISHES = ("stopped", "length", "aborted", "error", "ignored", "repetition")


def status_code(name: str) -> int:
    """The wire code of a request status name (``collector.channel.codec.STATUSES``)."""
    return STATUS_CODE.get(name, UNKNOWN_STATUS)


def _col(values: Column, code: str) -> bytes:
    if isinstance(values, bytes):
        return values
    if isinstance(values, array):
        return values.tobytes()
    return array(code, values).tobytes()


def _ids(ids: bytes | Iterable[str]) -> bytes:
    return ids if isinstance(ids, bytes) else "\0".join(ids).encode()


def _wire_columns(
    ids: bytes | Iterable[str],
    prompt_len: Column,
    computed: Column,
    output: Column,
    preemptions: Column,
    status: Column,
    mirror_rows: Column | None,
    host_blocks: Column | None,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | None, bytes | None]:
    """The columns in any accepted form as ``write_encoded`` takes them."""
    return (
        _ids(ids),
        _col(prompt_len, "I"),
        _col(computed, "I"),
        _col(output, "I"),
        _col(preemptions, "I"),
        status if isinstance(status, bytes) else bytes(status),
        None if mirror_rows is None else _col(mirror_rows, "i"),
        None if host_blocks is None else _col(host_blocks, "i"),
    )


def _same(a: bytes, b: bytes) -> bool:
    return a is b or a == b


class RequestRecorder(RecorderBase):
    """Writes the ``sched`` ring of one engine (the engine-core side in vLLM)."""

    role = "sched"

    def __init__(self, *args: Any, capacity: int = SCHED_RING_BYTES, **kwargs: Any) -> None:
        super().__init__(*args, capacity=capacity, **kwargs)
        # the running set's columns of the last full record (ids, prompt lengths, preemptions,
        # statuses, n), and how many records since kept them
        self._set: tuple[bytes, bytes, bytes, bytes, int] | None = None
        self._kept = 0

    def write_requests(
        self,
        step: int,
        *,
        ts: float | None = None,
        n: int,
        ids: bytes | Iterable[str],
        prompt_len: Column,
        computed: Column,
        output: Column,
        preemptions: Column,
        status: Column,
        mirror_rows: Column | None = None,
        host_blocks: Column | None = None,
    ) -> None:
        """The ``n`` running requests of ``step``, column by column (the same order in every
        column). ``ids``: the request ids, or their UTF-8 joined by NUL; ``status``: wire codes
        (``status_code``), or their bytes; ``computed`` includes this step's scheduled tokens."""
        channel = self.channel
        if not channel.active:
            return
        try:  # (a column that is not ints disables the recorder, it never raises into the engine)
            cols = _wire_columns(ids, prompt_len, computed, output, preemptions, status, mirror_rows, host_blocks)
        except Exception as exc:  # noqa: BLE001 - an unencodable value is our fault, not the engine's
            channel.fail(f"write_requests raised {exc!r}")
            return
        self.write_encoded(step, self.clock() if ts is None else ts, n, *cols)

    def write_encoded(
        self,
        step: int,
        ts: float,
        n: int,
        ids: bytes,
        prompt_len: bytes,
        computed: bytes,
        output: bytes,
        preemptions: bytes,
        status: bytes,
        mirror_rows: bytes | None = None,
        host_blocks: bytes | None = None,
    ) -> None:
        """``write_requests`` for columns already in their wire form, the engine's hot path:
        ``ids`` NUL-joined UTF-8, ``status`` one byte each, the other columns the bytes of an
        ``array("I")`` (``array("i")`` for ``mirror_rows`` and ``host_blocks``). Nothing is
        converted or checked here; the record is the one ``write_requests`` writes. The
        computed and output columns lie side by side in the record: a caller holding both in one
        buffer passes it as ``computed`` and ``b""`` as ``output``.

        While the running set's columns (ids, prompt lengths, preemptions, statuses) are those
        of the last full record, the same objects (compared by identity, else by value: they
        must be ``bytes``, never a buffer changed in place), the
        record keeps them (``FLAG_KEPT``: only the head, computed, output and the optional
        columns are written, a sixth of a full record at 256 running), for at most ``KEPT_MAX``
        records in a row; a reader in ring order takes them from the full record
        (``collector.channel.blocks.RequestRecords``)."""
        channel = self.channel
        if not channel.active:
            return
        try:
            flags = (0 if mirror_rows is None else FLAG_MIRROR) | (0 if host_blocks is None else FLAG_HOST_BLOCKS)
            held = self._set
            if (
                held is not None
                and n
                and self._kept < KEPT_MAX
                and held[4] == n
                and _same(held[0], ids)
                and _same(held[1], prompt_len)
                and _same(held[2], preemptions)
                and _same(held[3], status)
            ):
                # the running set did not change: only what a step changes is written
                self._kept += 1
                parts = [_HEAD.pack(TAG_REQS, step, ts, n, flags | FLAG_KEPT), computed, output]
                if mirror_rows is not None:
                    parts.append(mirror_rows)
                if host_blocks is not None:
                    parts.append(host_blocks)
                payload = b"".join(parts)
            else:
                self._set, self._kept = (ids, prompt_len, preemptions, status, n), 0
                parts = [_HEAD.pack(TAG_REQS, step, ts, n, flags), prompt_len, computed, output, preemptions, status]
                if mirror_rows is not None:
                    parts.append(mirror_rows)
                if host_blocks is not None:
                    parts.append(host_blocks)
                # the ids (most of a full record) go into the ring as they are, after the rest
                channel.write(b"".join(parts), None, ids)
                return
        except Exception as exc:  # noqa: BLE001 - an unencodable value is our fault, not the engine's
            channel.fail(f"write_requests raised {exc!r}")
            return
        channel.write(payload)

    def write_arrival(
        self,
        request_id: str,
        *,
        ts: float,
        prompt_len: int,
        max_tokens: int | None,
        n: int | None,
        ignore_eos: bool | None,
        has_stop: bool | None,
    ) -> None:
        """A request the engine saw for the first time; ``ts`` is when it arrived (unix s),
        the sampling parameters a replay needs as the client sent them (None: not known)."""
        self._emit("write_arrival", encode_arrival, request_id, ts, prompt_len, max_tokens, n, ignore_eos, has_stop)

    def write_end(
        self,
        request_id: str,
        *,
        ts: float | None = None,
        output_len: int | None,
        finish: str,
        cached_tokens: int | None,
    ) -> None:
        """A request that left the engine: output tokens, how it finished (``FINISHES``, or
        another vLLM status name), prompt tokens served from a cache (None: not known)."""
        self._emit("write_end", encode_end, request_id, self.clock() if ts is None else ts, output_len, finish, cached_tokens)
