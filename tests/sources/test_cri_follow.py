"""A container's log folder as the kubelet keeps it: CRI records, the container's restarts
(N.log -> N+1.log) and the kubelet's rotation (rename to N.log.<timestamp>, gzip), followed by
the engine-log source into events."""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
from pathlib import Path

from collector.model import Event, EventKind
from collector.sources.cri_follow import CriFolderTail, newest_log
from collector.sources.engine_log import EngineLogSource

TS = "2026-12-03T10:00:00.000000001Z"


def cri(stream: str, text: str, tag: str = "F") -> str:
    return f"{TS} {stream} {tag} {text}\n"


def write(path: Path, *records: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(records))


def test_newest_log_by_restart_count_not_by_name(tmp_path: Path) -> None:
    assert newest_log(tmp_path / "absent") is None
    for name in ("2.log", "10.log", "9.log", "10.log.20261203-100000", "10.log.20261203-090000.gz", "x.log"):
        (tmp_path / name).write_text("")
    assert newest_log(tmp_path) == (10, tmp_path / "10.log")


def test_starts_at_the_end_then_follows_restarts_in_order(tmp_path: Path) -> None:
    write(tmp_path / "0.log", cri("stdout", "old line, before the sidecar started"))
    tail = CriFolderTail(tmp_path)
    assert tail.read_lines() == []
    write(tmp_path / "0.log", cri("stderr", "RuntimeError: CUDA error: ", "P"), cri("stderr", "unspecified launch failure"))
    assert tail.read_lines() == ["RuntimeError: CUDA error: unspecified launch failure"]
    # the engine dies mid-line; the kubelet starts the container again: 1.log
    write(tmp_path / "0.log", cri("stderr", "last words, cut", "P"))
    write(tmp_path / "1.log", cri("stdout", "INFO starting again"))
    assert tail.read_lines() == ["last words, cut", "INFO starting again"]
    assert tail.current == 1 and tail.restarts_seen == 1


def test_the_kubelets_rotation_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    write(log, cri("stdout", "before"))
    tail = CriFolderTail(tmp_path, from_start=True)
    assert tail.read_lines() == ["before"]
    # the kubelet renames the live file; the runtime writes a last record to the open file,
    # then reopens 0.log; later the kubelet gzips the rotated file
    rotated = tmp_path / "0.log.20261203-100000"
    os.rename(log, rotated)
    write(rotated, cri("stdout", "written just before the runtime reopened"))
    write(log, cri("stdout", "after"))
    with open(rotated, "rb") as src, gzip.open(str(rotated) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    rotated.unlink()
    assert tail.read_lines() == ["written just before the runtime reopened", "after"]
    assert tail.rotations == 1


def test_a_folder_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    folder = tmp_path / "ns_pod_uid" / "vllm"
    tail = CriFolderTail(folder)
    assert tail.read_lines() == []
    folder.mkdir(parents=True)
    write(folder / "0.log", cri("stdout", "first line of a new pod"))
    assert tail.read_lines() == ["first line of a new pod"]


def test_engine_log_source_turns_a_pods_log_folder_into_events(tmp_path: Path) -> None:
    """The vLLM container writes to stdout/stderr only; the sidecar reads what the kubelet keeps."""
    folder = tmp_path / "default_vllm-decode-0_1b2c/vllm"
    folder.mkdir(parents=True)
    (folder / "0.log").write_text("")

    class Sink:
        def __init__(self) -> None:
            self.items: list[object] = []

        def emit(self, item: object) -> None:
            self.items.append(item)

    sink = Sink()
    source = EngineLogSource("decode-0", folder, poll_interval=0.02, idle_flush=0.1)

    async def main() -> None:
        task = asyncio.create_task(source.run(sink))
        await asyncio.sleep(0.1)
        write(
            folder / "0.log",
            cri("stderr", "(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710] EngineCore encountered a fatal error."),
            cri("stderr", "(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710] Traceback (most recent call last):"),
            cri("stderr", '(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710]   File "x.py", line 1, in f'),
            cri("stderr", "(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710] torch.AcceleratorError: CUDA error: ", "P"),
            cri("stderr", "unspecified launch failure"),
        )
        for _ in range(100):
            await asyncio.sleep(0.05)
            if any(isinstance(i, Event) and "unspecified launch failure" in i.message for i in sink.items):
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    events = [i for i in sink.items if isinstance(i, Event)]
    # one fatal-error record, its traceback's last line joined from two CRI records
    [fatal] = [e for e in events if e.kind == EventKind.ENGINE_FATAL]
    assert fatal.message == "torch.AcceleratorError: CUDA error: unspecified launch failure", events
    assert source.lines_read == 4  # five records, four lines
    # the CRI envelope never reaches the records
    assert not any(TS in getattr(i, "message", "") or TS in getattr(i, "line", "") for i in sink.items)
