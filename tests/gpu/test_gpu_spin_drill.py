"""The hang drill without a GPU: the spin kernel's flag file as another process releases and
reads it (scripts/gpu/probe/flightrec_spin.py), and the probe's ``block`` hang, which holds the
step's thread until released (scripts/gpu/probe/flightrec_gpu_probe.py)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "probe"))
import flightrec_gpu_probe as probe  # noqa: E402
import flightrec_spin as spin  # noqa: E402


def test_a_flag_file_is_released_and_read_from_outside(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    # as the kernel leaves it after its release: released, ended 1, 12345 polls
    flag.write_bytes((0).to_bytes(4, "little") + (1).to_bytes(4, "little") + (12345).to_bytes(8, "little"))
    assert spin.read_file(str(flag)) == {"released": False, "ended": "released", "polls": 12345}
    assert spin.release_file(str(flag))
    assert flag.read_bytes()[:4] == (1).to_bytes(4, "little")
    assert spin.read_file(str(flag))["released"] is True
    assert not spin.release_file(str(tmp_path / "gone")) and spin.read_file(str(tmp_path / "gone")) is None


def test_block_hang_holds_the_step_until_released(tmp_path: Path) -> None:
    fire = str(tmp_path / "r.fire")
    done = threading.Event()
    t = threading.Thread(target=lambda: (probe._hang(fire, "block", 1), done.set()), daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while not Path(fire + ".launched").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    record = json.loads(Path(fire + ".launched").read_text())
    assert record["kind"] == "block" and record["n"] == 1 and record["mode"] == "python" and record["ts"] <= time.time()
    time.sleep(0.3)
    assert not done.is_set()  # still held
    Path(fire + ".release").write_text("release")
    assert done.wait(5)
    assert not Path(fire + ".release").exists()  # consumed: the next hang waits for its own
