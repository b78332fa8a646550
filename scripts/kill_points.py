"""The kill points against any tree of the sidecar: what a SIGKILL at each point of a snapshot
leaves in the database after the next start, printed one line a point.

    git archive f649385 | tar -x -C OLD             # a tree without trigger intents, say
    python scripts/kill_points.py --tree OLD
    python scripts/kill_points.py                     # this tree

For each point (``tests/faults/kill_at.py`` names them) it writes one engine's ring of 300 steps,
starts that tree's ``flightrec serve`` through the kill wrapper, appends an Xid line to the
followed kernel-log file, waits for the SIGKILL, starts the sidecar again without the wrapper,
stops it with SIGTERM after a few seconds, and prints the Xid snapshots and Xid event rows the
database then holds (one of each is right). It needs the tree's own ``collector`` package to
have ``collector.snapshot.spool`` and ``collector.storage.repo`` (every tree since the spool).
Nothing here asserts: ``tests/faults/test_kill_points.py`` is the test.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.faults import sidecar_node as sn  # noqa: E402

POINTS = ("intent_tmp", "before_spool", "spool_tmp", "after_spool", "in_commit_tx", "after_commit", "in_amend")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=str(HERE), help="the sidecar tree to run (default: this one)")
    p.add_argument("--points", nargs="*", default=list(POINTS), choices=POINTS)
    args = p.parse_args()
    tree = Path(args.tree).resolve()
    wrapper = tree / "tests" / "faults" / "kill_at.py"
    if tree != HERE:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "tests" / "faults" / "kill_at.py", wrapper)  # the wrapper imports its tree's collector
    sn.ROOT, sn.WRAPPER = tree, wrapper
    print(f"tree {tree}")
    for point in args.points:
        work = Path(tempfile.mkdtemp(prefix="flightrec-kill-points-"))
        node = sn.make_node(work, f"sqlite:///{work / 'f.db'}")
        proc, base = node.start(point, "xid")
        sn.wait_for("the ring read", lambda url=base: sn.steps_in(url) >= 300, 30)
        with open(node.kmsg, "a") as f:
            f.write(sn.XID_LINE.format(seq=1, us=1) + "\n")
        proc.wait(timeout=60)
        rc = proc.returncode
        proc, base = node.start()
        time.sleep(4.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        snaps = sn.query(node.db, "SELECT count(*) FROM snapshots WHERE trigger_kind = 'xid'")[0][0]
        events = sn.query(node.db, "SELECT count(*) FROM events WHERE kind = 'xid'")[0][0]
        print(
            f"{point:>13}: {'killed there' if rc == -signal.SIGKILL else f'NOT killed (rc {rc})'}; after the restart "
            f"{snaps} Xid snapshot(s), {events} Xid event row(s)",
            flush=True,
        )
        if node.ring is not None:
            node.ring.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
