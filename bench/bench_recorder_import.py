"""What the in-engine recorder adds to a vLLM process's start: the time to import the stat-logger
plugin and the scheduler module once vLLM's own modules are loaded, and how many modules that
brings in.

Each run is a fresh interpreter (``python -X importtime``) that first imports the vLLM modules
the recorder builds on, then ``collector.vllm.plugin`` and ``collector.vllm.scheduler``; the
figure is the sum of the cumulative times of the top-level ``collector`` imports, as
``-X importtime`` reports them. Prints the median and range over the runs.

    python bench/bench_recorder_import.py --python /path/to/vllm-venv/bin/python --runs 9

Run it with ``PYTHONPATH`` set to the tree to measure (the vLLM venv may have another copy of
this package installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

VLLM_FIRST = "import vllm.v1.metrics.loggers, vllm.v1.core.sched.async_scheduler, vllm.v1.core.sched.scheduler"
OURS = "import collector.vllm.plugin, collector.vllm.scheduler"


def one_run(python: str) -> tuple[float, int]:
    """(milliseconds spent importing the recorder, modules it added) for one fresh process."""
    code = f"{VLLM_FIRST}\nimport sys\nn0 = len(sys.modules)\n{OURS}\nprint('ADDED', len(sys.modules) - n0)"
    proc = subprocess.run(
        [python, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
        cwd=tempfile.gettempdir(),  # ``-c`` puts the working folder first on sys.path: not a tree of ours
    )
    # The importtime lines go to stderr, one per module as it finishes, indented by depth; ours
    # are the top-level ``collector`` ones (vLLM modules they import sit under them).
    total_us = 0
    for ln in proc.stderr.splitlines():
        if not ln.startswith("import time:") or "|" not in ln:
            continue
        _, cumulative, name = ln.removeprefix("import time:").split("|")
        if name.startswith(" collector") and cumulative.strip().isdigit():
            total_us += int(cumulative)
    added = int(next(ln for ln in proc.stdout.splitlines() if ln.startswith("ADDED")).split()[1])
    return total_us / 1000.0, added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="an interpreter that has vLLM")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    results = [one_run(args.python) for _ in range(args.runs)]
    ms = [r[0] for r in results]
    added = {r[1] for r in results}
    print(f"recorder import after vLLM's: median {statistics.median(ms):.1f} ms (min {min(ms):.1f}, max {max(ms):.1f}) over {args.runs} runs")
    print(f"modules added: {sorted(added)}")
    print(f"load average: {' '.join(load)}")
    if args.json:
        doc = {"runs": args.runs, "import_ms": {"median": round(statistics.median(ms), 1), "min": round(min(ms), 1), "max": round(max(ms), 1)}}
        doc["modules_added"] = sorted(added)
        doc["load_before"] = load
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
