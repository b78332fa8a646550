"""A process that hangs the way an engine core does: its main thread blocked in a named function
(waiting on a lock nobody releases), beside a helper thread that waits for work and a thread that
keeps moving. It prints ``ready`` once all three run. Used by tests/stacks (py-spy reads it) and
to record tests/fixtures/stacks/*.json."""

from __future__ import annotations

import queue
import sys
import threading
import time

lock = threading.Lock()
lock.acquire()
work: queue.Queue[int] = queue.Queue()


def wait_for_the_engine_lock() -> None:
    lock.acquire()  # the blocking frame: never released


def helper() -> None:
    while True:
        work.get()  # idle: waiting for work that never comes


def tick_a() -> None:
    time.sleep(0.01)


def tick_b() -> None:
    time.sleep(0.013)


def mover() -> None:
    while True:
        tick_a()
        tick_b()


def main() -> None:
    threading.Thread(target=helper, name="helper-queue", daemon=True).start()
    threading.Thread(target=mover, name="mover", daemon=True).start()
    time.sleep(0.2)
    print("ready", flush=True)
    sys.stdout.flush()
    wait_for_the_engine_lock()


def title(name: str) -> None:
    """The process's name (comm) as vLLM's setproctitle sets it: ``VLLM::EngineCore`` reads
    ``VLLM::EngineCor`` there (15 characters)."""
    import ctypes

    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME


if __name__ == "__main__":
    if len(sys.argv) > 1:
        title(sys.argv[1])
    main()
