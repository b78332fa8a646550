"""The two rings of one simulated engine (``stats`` from its API server, ``sched`` from its
engine core), written through the engine-side recorder API as vLLM's adapters write.

``open_rings`` uses ``collector.recorder`` (``EngineIdentity``, ``StatsRecorder``,
``RequestRecorder``) where this version has it. A recorder version before that API (the node
benchmark drives older sidecars with this load) gets ``ChannelRings``: the same records through
that version's ``RecorderChannel``, or through a bare ring writer that writes the meta record
first and at every wrap, as the channel does.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import Any, Protocol

from collector.channel import RingWriter
from collector.channel.codec import encode, encode_request_columns, encode_step_fields
from collector.channel.naming import ring_file_name

STATS_RING_BYTES = 4 * 1024 * 1024  # the recorder's sizes
SCHED_RING_BYTES = 16 * 1024 * 1024


class EngineRings(Protocol):
    engine: str

    def fingerprint(self, facts: dict[str, Any], ts: float) -> None: ...
    def step(
        self,
        step: int,
        ts: float,
        *,
        running: int,
        kv_cache_usage: float,
        prompt_tokens: int,
        generation_tokens: int,
        finished: int,
        extras: dict[str, Any] | None,
    ) -> None: ...
    def requests(
        self, step: int, ts: float, n: int, ids: bytes, prompt_len: bytes, computed: bytes, output: bytes, preemptions: bytes, status: bytes
    ) -> None: ...
    def arrival(self, request_id: str, ts: float, prompt_len: int, max_tokens: int) -> None: ...
    def end(self, request_id: str, ts: float, output_len: int, finish: str) -> None: ...
    def close(self) -> None: ...


def this_run() -> int:
    """The simulated engine's run id, as the recorder takes a real engine's: the start time (in
    ms) of the process that plays its API server (this one), so a simulator started again on the
    same simulated pids writes new ring files, as a restarted container does."""
    from collector.recorder.identity import process_start_ms

    return process_start_ms(os.getpid()) or int(time.time() * 1000)


class RecorderRings:
    """Through ``collector.recorder``: exactly the calls vLLM's adapters make."""

    def __init__(
        self, api: Any, directory: Path, *, server_pid: int, core_pid: int, port: int | None, name: str | None, version: str, workload_records: bool
    ) -> None:
        self._wl = workload_records
        run: dict[str, int] = {"run": this_run()} if "run" in getattr(api.EngineIdentity, "__dataclass_fields__", {}) else {}
        identity = api.EngineIdentity(
            server_pid=server_pid,
            engine_index=0,
            server_host="127.0.0.1" if port else None,
            server_port=port,
            name=name,
            engine_version=version,
            **run,
        )
        self.engine = identity.engine
        self._stats = api.StatsRecorder(identity, directory=directory, pid=server_pid)
        self._sched = api.RequestRecorder(identity, directory=directory, pid=core_pid)
        for rec in (self._stats, self._sched):
            if not rec.active:
                raise OSError(f"recorder of {self.engine} failed: {rec.failed}")

    def fingerprint(self, facts: dict[str, Any], ts: float) -> None:
        self._stats.write_fingerprint(facts, ts=ts)
        self._sched.write_fingerprint(facts, ts=ts)

    def step(
        self,
        step: int,
        ts: float,
        *,
        running: int,
        kv_cache_usage: float,
        prompt_tokens: int,
        generation_tokens: int,
        finished: int,
        extras: dict[str, Any] | None,
    ) -> None:
        self._stats.write_step(
            step,
            ts=ts,
            running=running,
            waiting=0,
            deferred=0,
            kv_cache_usage=kv_cache_usage,
            preemptions=0,
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            finished=finished,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            extras=extras,
        )

    def requests(
        self, step: int, ts: float, n: int, ids: bytes, prompt_len: bytes, computed: bytes, output: bytes, preemptions: bytes, status: bytes
    ) -> None:
        self._sched.write_requests(
            step, ts=ts, n=n, ids=ids, prompt_len=prompt_len, computed=computed, output=output, preemptions=preemptions, status=status
        )

    def arrival(self, request_id: str, ts: float, prompt_len: int, max_tokens: int) -> None:
        if self._wl:
            self._sched.write_arrival(request_id, ts=ts, prompt_len=prompt_len, max_tokens=max_tokens, n=1, ignore_eos=True, has_stop=False)

    def end(self, request_id: str, ts: float, output_len: int, finish: str) -> None:
        if self._wl:
            self._sched.write_end(request_id, ts=ts, output_len=output_len, finish=finish, cached_tokens=0)

    def close(self) -> None:
        self._stats.close()
        self._sched.close()


class _Ring:
    """One ring through a version's ``RecorderChannel`` (``channel``), else a bare writer."""

    def __init__(self, channel_cls: Any, directory: Path, engine: str, role: str, pid: int, capacity: int, version: str) -> None:
        self._channel = None
        if channel_cls is not None:
            self._channel = channel_cls(
                engine=engine, engine_index=0, role=role, vllm_version=version, directory=directory, capacity=capacity, pid=pid
            )
            if not self._channel.active:
                raise OSError(f"recorder channel of {engine} ({role}) failed: {self._channel.failed}")
            self.write = self._channel.write
            return
        directory.mkdir(parents=True, exist_ok=True)
        self._ring = RingWriter(directory / ring_file_name(engine, role, pid), capacity=capacity)
        self._capacity, self._wrap = capacity, 0
        self._meta = encode(
            {"t": "meta", "engine": engine, "engine_index": 0, "role": role, "pid": pid, "vllm_version": version, "format": 2, "created": time.time()}
        )
        self._ring.append(self._meta)
        self.write = self._append

    def _append(self, payload: bytes) -> None:
        self._ring.append(payload)
        wrap = self._ring.head // self._capacity
        if wrap != self._wrap:
            self._wrap = wrap
            self._ring.append(self._meta)

    def close(self) -> None:
        (self._channel or self._ring).close()


class ChannelRings:
    """The same records for a recorder version before ``collector.recorder``'s API (the
    workload as the JSON ``wl`` records those versions read)."""

    def __init__(self, channel_cls: Any, directory: Path, *, server_pid: int, core_pid: int, name: str, version: str, workload_records: bool) -> None:
        self.engine = name
        self._stats = _Ring(channel_cls, directory, name, "stats", server_pid, STATS_RING_BYTES, version)
        self._sched = _Ring(channel_cls, directory, name, "sched", core_pid, SCHED_RING_BYTES, version)
        self._wl = workload_records

    def fingerprint(self, facts: dict[str, Any], ts: float) -> None:
        fp = encode({"t": "fp", "engine": self.engine, "ts": ts, "facts": facts})
        self._stats.write(fp)
        self._sched.write(fp)

    def step(
        self,
        step: int,
        ts: float,
        *,
        running: int,
        kv_cache_usage: float,
        prompt_tokens: int,
        generation_tokens: int,
        finished: int,
        extras: dict[str, Any] | None,
    ) -> None:
        self._stats.write(encode_step_fields(step, ts, 0, running, 0, 0, kv_cache_usage, 0, prompt_tokens, generation_tokens, finished, 0, 0, extras))

    def requests(
        self, step: int, ts: float, n: int, ids: bytes, prompt_len: bytes, computed: bytes, output: bytes, preemptions: bytes, status: bytes
    ) -> None:
        self._sched.write(encode_request_columns(step, ts, n, ids, prompt_len, computed, output, preemptions, status))

    def arrival(self, request_id: str, ts: float, prompt_len: int, max_tokens: int) -> None:
        if self._wl:
            self._sched.write(
                encode(
                    {
                        "t": "wl",
                        "engine": self.engine,
                        "ev": "arrive",
                        "id": request_id,
                        "ts": ts,
                        "prompt_len": prompt_len,
                        "max_tokens": max_tokens,
                        "n": 1,
                        "ignore_eos": True,
                        "has_stop": False,
                    }
                )
            )

    def end(self, request_id: str, ts: float, output_len: int, finish: str) -> None:
        if self._wl:
            self._sched.write(
                encode(
                    {
                        "t": "wl",
                        "engine": self.engine,
                        "ev": "end",
                        "id": request_id,
                        "ts": ts,
                        "output_len": output_len,
                        "finish": finish,
                        "cached_tokens": 0,
                    }
                )
            )

    def close(self) -> None:
        self._stats.close()
        self._sched.close()


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def open_rings(
    directory: Path, *, server_pid: int, port: int | None, name: str | None, default_name: str, version: str, workload_records: bool = True
) -> EngineRings:
    """The engine's rings through the newest recorder interface this version has. The engine
    core's pid is the API server's + 1 (its child)."""
    api = _module("collector.recorder")
    if api is not None and hasattr(api, "StatsRecorder"):
        return RecorderRings(
            api, directory, server_pid=server_pid, core_pid=server_pid + 1, port=port, name=name, version=version, workload_records=workload_records
        )
    channel = None
    for mod in ("collector.recorder.channel", "collector.vllm.channel_writer"):
        found = _module(mod)
        if found is not None and hasattr(found, "RecorderChannel"):
            channel = found.RecorderChannel
            break
    return ChannelRings(
        channel,
        directory,
        server_pid=server_pid,
        core_pid=server_pid + 1,
        name=name or default_name,
        version=version,
        workload_records=workload_records,
    )
