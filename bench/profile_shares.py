"""Where a sampled process spends its time: the share of py-spy's samples under each function.

    flightrec simulate --engines 8 --running 256 --steps-per-second 100 --duration 70 \\
        --recorder-dir rings --write-config sim.yaml --serve-metrics --start-delay 3 &
    flightrec serve --config sim.yaml --port 18787 --db sqlite:///fr.db &
    py-spy record -p <serve's pid> -d 25 -r 100 -f raw -o raw.txt     # after ~20 s of load
    python bench/profile_shares.py raw.txt

Prints, for the functions that take the most samples (counted once per stack, so a caller
includes its callees), the share of all samples, and the sampled share of one core.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

_FRAME = re.compile(r" \((?P<file>[^:()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    m = _FRAME.search(frame)
    if m is None:
        return frame
    return f"{frame[: m.start()]} ({Path(m.group('file')).name})"


def shares(lines: list[str]) -> tuple[int, collections.Counter[str]]:
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    for line in lines:
        line = line.rstrip()
        if not line or " " not in line:
            continue
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for name in {frame_name(f) for f in stack.split(";")}:
            inclusive[name] += n
    return total, inclusive


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", type=Path, help="py-spy record -f raw output")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--seconds", type=float, default=25.0, help="the recording's duration")
    p.add_argument("--rate", type=float, default=100.0, help="py-spy's samples per second")
    args = p.parse_args()
    total, inclusive = shares(args.raw.read_text().splitlines())
    if not total:
        raise SystemExit("no samples")
    print(f"{total} samples: {100 * total / (args.seconds * args.rate):.1f}% of one core sampled")
    for name, n in inclusive.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
