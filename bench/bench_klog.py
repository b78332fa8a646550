"""What the syslog(2) kernel-log source (kmsg: syslog) costs per poll: one READ_ALL of the ring
and the search for what is new, on this machine's real ring and on synthetic rings of GPU-server
sizes (log_buf_len 1 and 4 MiB, full of dmesg-like lines), with one new line per poll.

    PYTHONPATH=. .venv/bin/python bench/bench_klog.py [--polls 200]
"""

from __future__ import annotations

import argparse
import os
import time

from collector.sources.klog import KlogSource, klogctl_read_all


class Sink:
    def emit(self, item: object) -> None:
        pass


def synthetic(size: int) -> list[str]:
    lines, n, total = [], 0, 0
    while total < size:
        line = f"<6>[{n // 1000:6d}.{n % 1000:06d}] mlx5_core 0000:{n % 256:02x}:00.0: port {n % 8} link up, speed 400G, flow control rx/tx"
        lines.append(line)
        total += len(line) + 1
        n += 1
    return lines


def bench(name: str, reader_factory: object, polls: int) -> None:
    src = KlogSource(reader=reader_factory)  # type: ignore[arg-type]
    sink = Sink()
    src.poll(sink)  # the first read: what is there is not news
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(polls):
        src.poll(sink)
    wall = (time.perf_counter() - t0) / polls
    cpu = (time.process_time() - c0) / polls
    print(f"{name:28s} {wall * 1e3:8.3f} ms/poll  cpu {cpu * 1e3:8.3f} ms/poll  = {cpu / 0.25 * 100:5.2f}% of a core at 4 polls/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--polls", type=int, default=200)
    args = ap.parse_args()
    print(f"load {open('/proc/loadavg').read().strip()}  cpus {os.cpu_count()}")
    try:
        real = klogctl_read_all()
        print(f"this machine's ring: {len(real.encode())} bytes, {real.count(chr(10))} lines")
        bench("real ring (syslog(2))", klogctl_read_all, args.polls)
    except OSError as exc:
        print(f"real ring: syslog(2) refused here ({exc})")
    for mib in (1, 4):
        state = {"n": 0, "text": "\n".join(synthetic(mib << 20)) + "\n"}

        def reader(state: dict[str, object] = state) -> str:
            # one new line per poll and the oldest one out (a full ring): a copy, as the kernel's
            n = int(state["n"]) + 1  # type: ignore[call-overload]
            text = str(state["text"])
            state["n"], state["text"] = n, text[text.index("\n") + 1 :] + f"<4>[999999.{n:06d}] NVRM: test line {n}\n"
            return str(state["text"])

        bench(f"synthetic {mib} MiB ring", reader, args.polls)


if __name__ == "__main__":
    main()
