"""A kernel that spins on the GPU until it is released: a real GPU hang that can end.

One thread polls an int32 flag in host memory mapped into the GPU's address space and returns
once the flag is non-zero, or after its own time limit (read from the GPU's global timer), so a
drill that loses its host side still leaves a GPU that frees itself. Launched on the stream the
model runs on, it holds every kernel queued behind it: the engine's next synchronisation with
the GPU waits, the GPU reads 100% utilisation, and nothing faults.

The flag is a 16-byte file in /dev/shm, mapped and registered with the CUDA driver
(``cuMemHostRegister``, device-mapped): any process can release the kernel by writing to the
file, also while the engine's own threads are all blocked. Where that is refused, pinned host
memory from CuPy (device-accessible at the same address under unified addressing) is used and
a thread of the engine's process writes the flag when a release file appears. Layout: int32
release (host writes 1), int32 how the kernel ended (1 released, 2 timed out), uint64 polls.

    python3 flightrec_spin.py --selftest [--out FILE]   # launch, watch NVML, release, time it

CuPy (NVRTC) compiles the kernel, as the ``trap`` drill does; only this process's own memory
and stream are touched, no GPU setting is changed.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import threading
import time
from typing import Any

SOURCE = r"""
extern "C" __global__ void flightrec_spin(unsigned long long flag_addr, unsigned long long limit_ns) {
    volatile int* flag = (volatile int*)flag_addr;
    unsigned long long t0, now, polls = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - t0 > limit_ns) { flag[1] = 2; *((volatile unsigned long long*)(flag + 2)) = polls; return; }
        ++polls;
        __nanosleep(1000);
    }
    flag[1] = 1;
    *((volatile unsigned long long*)(flag + 2)) = polls;
}
"""
FLAG_BYTES = 16
_kernel: Any = None


class Flag:
    """The release flag: host memory the GPU reads. ``mode`` says which kind it is (``shm``:
    a /dev/shm file registered with the driver, releasable from any process; ``pinned``: CuPy
    pinned memory, released by this process's watcher thread)."""

    def __init__(self, tag: str) -> None:
        self.path: str | None = None
        self.mode = ""
        self.error: str | None = None
        self._keep: Any = None
        try:
            self._shm(tag)
        except Exception as exc:  # noqa: BLE001 - the fallback below still gives a flag
            self.error = f"shm flag refused: {exc!r}"
            self._pinned()

    def _shm(self, tag: str) -> None:
        path = f"/dev/shm/flightrec-spin-{os.getpid()}-{tag}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            mm = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        buf = (ctypes.c_char * mmap.PAGESIZE).from_buffer(mm)
        host = ctypes.addressof(buf)
        cuda = ctypes.CDLL("libcuda.so.1")
        # CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
        rc = cuda.cuMemHostRegister_v2(ctypes.c_void_p(host), ctypes.c_size_t(mmap.PAGESIZE), ctypes.c_uint(1 | 2))
        if rc != 0:
            del buf
            mm.close()
            os.unlink(path)
            raise OSError(f"cuMemHostRegister_v2 returned {rc}")
        dev = ctypes.c_uint64(0)
        rc = cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), ctypes.c_void_p(host), ctypes.c_uint(0))
        if rc != 0:
            raise OSError(f"cuMemHostGetDevicePointer_v2 returned {rc}")
        self.host, self.device, self.path, self.mode = host, int(dev.value), path, "shm"
        self._keep = (mm, buf)

    def _pinned(self) -> None:
        import cupy as cp

        mem = cp.cuda.alloc_pinned_memory(FLAG_BYTES)
        ctypes.memset(mem.ptr, 0, FLAG_BYTES)
        self.host = self.device = int(mem.ptr)
        self.mode = "pinned"
        self._keep = mem

    def release(self) -> None:
        ctypes.c_int32.from_address(self.host).value = 1

    def state(self) -> dict[str, Any]:
        ended = ctypes.c_int32.from_address(self.host + 4).value
        return {
            "released": bool(ctypes.c_int32.from_address(self.host).value),
            "ended": {0: None, 1: "released", 2: "timed out"}.get(ended, str(ended)),
            "polls": ctypes.c_uint64.from_address(self.host + 8).value,
        }


def release_file(path: str) -> bool:
    """Release a kernel from outside its process: write 1 into its /dev/shm flag."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.pwrite(fd, (1).to_bytes(4, "little"), 0)
        return True
    finally:
        os.close(fd)


def read_file(path: str) -> dict[str, Any] | None:
    """How a kernel ended, from outside its process (None: the flag file is gone)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(FLAG_BYTES)
    except OSError:
        return None
    ended = int.from_bytes(raw[4:8], "little")
    return {
        "released": bool(int.from_bytes(raw[0:4], "little")),
        "ended": {0: None, 1: "released", 2: "timed out"}.get(ended, str(ended)),
        "polls": int.from_bytes(raw[8:16], "little"),
    }


def launch(flag: Flag, limit_s: float, stream_ptr: int) -> float:
    """Queue the kernel on the CUDA stream ``stream_ptr`` (the model's); returns the launch's wall
    time. The host does not wait: whatever synchronises with the stream next does."""
    global _kernel
    import cupy as cp
    import numpy as np

    if _kernel is None:
        _kernel = cp.RawModule(code=SOURCE).get_function("flightrec_spin")
    stream = cp.cuda.ExternalStream(stream_ptr)
    launched = time.time()
    _kernel((1,), (1,), (np.uint64(flag.device), np.uint64(int(limit_s * 1e9))), stream=stream)
    return launched


def watch_release(flag: Flag, release_path: str, limit_s: float, on_release: Any = None) -> threading.Thread:
    """A thread that writes the flag once ``release_path`` exists (then removes that file): the
    release for a flag no other process can write; harmless beside a /dev/shm one."""

    def run() -> None:
        deadline = time.monotonic() + limit_s + 5
        while time.monotonic() < deadline:
            if os.path.exists(release_path):
                flag.release()
                try:
                    os.unlink(release_path)
                except OSError:
                    pass
                if on_release is not None:
                    on_release(time.time())
                return
            time.sleep(0.002)

    t = threading.Thread(target=run, daemon=True, name="flightrec-spin-release")
    t.start()
    return t


def _nvml_util() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return lambda: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
    except Exception:  # noqa: BLE001 - no NVML: utilisation unknown
        return None


def selftest(hold_s: float = 2.0) -> dict[str, Any]:
    """Launch the kernel on a stream of this process, read NVML's utilisation while it spins,
    release it through its /dev/shm file (as a drill's other process would) and time the
    release until the stream is free again."""
    import cupy as cp

    out: dict[str, Any] = {"ok": False}
    cp.zeros(1, dtype=cp.int32)  # the context
    flag = Flag("selftest")
    out.update(mode=flag.mode, flag_error=flag.error)
    stream = cp.cuda.Stream(non_blocking=True)
    util = _nvml_util()
    t_compile = time.perf_counter()
    launched = launch(flag, limit_s=hold_s + 30, stream_ptr=stream.ptr)
    out["compile_and_launch_ms"] = round(1000 * (time.perf_counter() - t_compile), 1)
    samples = []
    t_end = time.monotonic() + hold_s
    while time.monotonic() < t_end:
        samples.append(None if util is None else util())
        time.sleep(0.2)
    out["util_while_spinning"] = samples
    out["stream_busy_while_spinning"] = not stream.done
    t_rel = time.time()
    if flag.path:
        release_file(flag.path)
    else:
        flag.release()
    stream.synchronize()
    out["release_to_stream_free_ms"] = round(1000 * (time.time() - t_rel), 3)
    out["held_s"] = round(t_rel - launched, 3)
    out["flag"] = flag.state()
    time.sleep(1.5)
    out["util_after"] = None if util is None else util()
    out["ok"] = bool(out["stream_busy_while_spinning"] and out["flag"]["ended"] == "released")
    if flag.path:
        os.unlink(flag.path)
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="the spin kernel on its own: launch, watch, release")
    ap.add_argument("--selftest", action="store_true", required=True)
    ap.add_argument("--hold-s", type=float, default=2.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        result = selftest(args.hold_s)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the drill falls back
        result = {"ok": False, "error": repr(exc)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    raise SystemExit(0 if result.get("ok") else 1)
