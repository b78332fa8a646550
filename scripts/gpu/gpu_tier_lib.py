"""Parts of the GPU tier (scripts/gpu/vllm_gpu_tier.py): a vLLM server, the sidecar, an
Alertmanager-shaped receiver on loopback, a streaming load client, the probe's files.

Standard library only (plus the project for the ring decoders), so it runs with whatever Python
has vLLM; every process it starts is its own and in its own process group.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Llama-shaped, about 1.1 billion parameters (TinyLlama's shape); dummy weights, no tokenizer.
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_hidden_layers": 22,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A few MB: for a smoke run of the script itself on vLLM's CPU build.
LLAMA_TINY = {
    **LLAMA_1B,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
}


def write_model(folder: Path, tiny: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_TINY if tiny else LLAMA_1B))
    return folder


def probe_site(folder: Path) -> Path:
    """A folder holding the probe plugin (and the drill's spin kernel) and its entry point's
    metadata, for PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for module in (HERE / "probe").glob("*.py"):  # the plugin and the modules it imports
        (folder / module.name).write_text(module.read_text())
    dist = folder / "flightrec_gpu_probe-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flightrec-gpu-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\nflightrec_gpu_probe = flightrec_gpu_probe:register\n")
    return folder


def get_json(url: str, timeout: float = 10.0, token: str | None = None) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: Any, token: str | None = None, timeout: float = 30.0) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not answer {url} within {timeout} s")


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Vllm:
    """One real vLLM OpenAI server on the GPU."""

    name: str
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]
    model: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def engine_core_pid(self) -> int | None:
        for pid in descendants(self.proc.pid):
            if "EngineCore" in cmdline(pid):
                return pid
        return None


def start_vllm(
    name: str,
    python: str,
    model: Path,
    workdir: Path,
    pythonpath: Sequence[Path | str],
    *,
    recorder: bool,
    probe: bool,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    kv_cache_bytes: int = 16 * 1024**3,
    gpu_util: float = 0.25,
) -> Vllm:
    port = free_port()
    log_path = workdir / f"vllm-{name}.log"
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--max-model-len",
        "8192",
        "--dtype",
        "bfloat16",
        "--gpu-memory-utilization",
        str(gpu_util),
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(["--scheduler-cls", "collector.vllm.RecordingScheduler"] if recorder else []),
        *extra_args,
    ]
    plugins = [p for p, on in (("flightrec", recorder), ("flightrec_gpu_probe", probe)) if on]
    full_env = dict(os.environ)
    full_env.update(
        {
            "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
            "VLLM_USE_FLASHINFER_SAMPLER": "0",
            "HF_HUB_OFFLINE": "1",
            # only these plugins load (the stat logger's group is filtered by it too): the run
            # without the recorder has none of this package in vLLM
            "VLLM_PLUGINS": ",".join(plugins),
            "PYTHONUNBUFFERED": "1",
        }
    )
    full_env.pop("FLIGHTREC_ENGINE_NAME", None)  # joined by URL, as the README says
    full_env.update(env or {})
    out = open(log_path, "wb")  # noqa: SIM115 - the child's for its whole life
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True, cwd=workdir)
    return Vllm(name=name, port=port, log_path=log_path, proc=proc, model=name)


@dataclass
class Sidecar:
    port: int
    proc: subprocess.Popen[bytes]
    db: Path
    log_path: Path
    token: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, timeout: float = 30.0) -> Any:
        return get_json(f"{self.base}/api/v1{path}", timeout=timeout, token=self.token)

    def engines(self) -> list[dict[str, Any]]:
        """/api/v1/engines' rows (a page {items, next_cursor}; a plain list from older sidecars)."""
        body = self.api("/engines")
        return list(body.get("items") or []) if isinstance(body, dict) else list(body)


def start_sidecar(
    python: str,
    workdir: Path,
    pythonpath: Sequence[Path | str],
    engines: Sequence[Vllm],
    recorder_dir: Path,
    *,
    alertmanager: str | None,
    gpu: bool,
    ring_steps: int = 4096,
) -> Sidecar:
    port = free_port()
    token = "gpu-tier-" + os.urandom(8).hex()
    lines = ["engines:"]
    for e in engines:
        lines += [f"  - name: {e.name}", f"    url: {e.base}", f"    log: {e.log_path}"]
    lines += [
        "scrape_interval: 1.0",
        f"ring_steps: {ring_steps}",
        f"nvml: '{'on' if gpu else 'off'}'",  # quoted: YAML reads a bare on/off as a boolean
        f"kmsg: '{'auto' if gpu else 'off'}'",
        f"api_token: {token}",
        f"recorder_dir: {recorder_dir}",
        f"public_url: http://127.0.0.1:{port}",
    ]
    if alertmanager:
        lines.append(f"alertmanager: [{alertmanager}]")
    config = workdir / "flightrec.yaml"
    config.write_text("\n".join(lines) + "\n")
    db = workdir / "flightrec.db"
    log_path = workdir / "sidecar.log"
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath), "PYTHONUNBUFFERED": "1"})
    out = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [python, "-m", "collector.cli", "serve", "--config", str(config), "--port", str(port), "--db", f"sqlite:///{db}"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        cwd=workdir,
    )
    side = Sidecar(port=port, proc=proc, db=db, log_path=log_path, token=token)
    wait_http(f"{side.base}/healthz", proc, 90, "the sidecar")
    return side


class Receiver:
    """Alertmanager's v2 alerts endpoint on loopback: keeps each POST with its arrival time."""

    def __init__(self) -> None:
        self.received: list[tuple[float, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    outer.received.append((time.time(), json.loads(body)))
                except ValueError:
                    outer.received.append((time.time(), body.decode(errors="replace")))
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"cluster":{"status":"ready"}}')

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[tuple[float, dict[str, Any]]]:
        out = []
        for ts, body in self.received:
            if isinstance(body, list):
                out.extend((ts, a) for a in body if isinstance(a, dict))
        return out


class LogWatch:
    """Notes when a line matching one of the patterns first appears in a file (10 ms polls)."""

    def __init__(self, path: Path, patterns: Sequence[str]) -> None:
        self.path = path
        self.patterns = list(patterns)
        self.first: dict[str, float] = {}
        self._stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        pos = 0
        buf = b""
        while not self._stop:
            try:
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos += len(chunk)
            except OSError:
                chunk = b""
            if chunk:
                now = time.time()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    for p in self.patterns:
                        if p not in self.first and p in text:
                            self.first[p] = now
            time.sleep(0.01)

    def close(self) -> None:
        self._stop = True


Hist = dict[str, Any]  # the probe's histogram: n, sum, max, bins {bin: count} (8 bins an octave)
_BINS_PER_OCTAVE = 8


def hist_merge(a: Hist, b: Hist) -> Hist:
    bins = {str(k): int(v) for k, v in (a.get("bins") or {}).items()}
    for k, v in (b.get("bins") or {}).items():
        bins[str(k)] = bins.get(str(k), 0) + int(v)
    return {"n": a.get("n", 0) + b.get("n", 0), "sum": a.get("sum", 0) + b.get("sum", 0), "max": max(a.get("max", 0), b.get("max", 0)), "bins": bins}


def hist_sub(after: Hist, before: Hist) -> Hist:
    """What ``after`` counted since ``before`` (the probe's histograms only grow); ``max`` is
    the whole life's."""
    prev = {str(k): int(v) for k, v in (before.get("bins") or {}).items()}
    bins = {str(k): int(v) - prev.get(str(k), 0) for k, v in (after.get("bins") or {}).items()}
    return {
        "n": after.get("n", 0) - before.get("n", 0),
        "sum": after.get("sum", 0) - before.get("sum", 0),
        "max": after.get("max", 0),
        "bins": {k: v for k, v in bins.items() if v > 0},
    }


def hist_quantile(h: Hist, q: float) -> float | None:
    """The q-quantile of a histogram: the geometric middle of the bin it falls in (+-4.5%)."""
    bins = sorted((int(k), int(v)) for k, v in (h.get("bins") or {}).items() if int(v) > 0)
    total = sum(v for _, v in bins)
    if not total:
        return None
    rank = q * (total - 1)
    seen = 0
    for b, v in bins:
        seen += v
        if seen > rank:
            return float(2 ** ((b + 0.5) / _BINS_PER_OCTAVE))
    return float(2 ** ((bins[-1][0] + 0.5) / _BINS_PER_OCTAVE))


def hist_summary(h: Hist, unit: float, digits: int = 2) -> dict[str, Any]:
    """n, mean, p50, p99 (and the life's max) in ``unit`` (1000: ns -> us)."""
    n = int(h.get("n") or 0)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x / unit, digits)

    return {
        "n": n,
        "mean": r(h["sum"] / n) if n else None,
        "p50": r(hist_quantile(h, 0.5)),
        "p99": r(hist_quantile(h, 0.99)),
        "max": r(h.get("max")),
    }


def _merge_into(into: dict[str, Hist], more: dict[str, Any]) -> None:
    for key, h in (more or {}).items():
        into[key] = hist_merge(into.get(key, {}), h)


def read_probe(directory: Path) -> dict[str, Any]:
    """The probe's counts summed over the processes that wrote them, histograms merged."""
    total: dict[str, Any] = {"schedule_calls": 0, "schedule_with_tokens": 0, "forward_calls": 0, "files": 0}
    timings: dict[str, dict[str, Hist]] = {}
    gaps: dict[str, Hist] = {}
    gcs: dict[str, dict[str, Hist]] = {}
    writes = {"n": 0, "total_ns": 0, "max_ns": 0}
    launched = None
    for path in sorted(directory.glob("steps.*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        total["files"] += 1
        for key in ("schedule_calls", "schedule_with_tokens", "forward_calls"):
            total[key] += int(data.get(key) or 0)
        for series, buckets in (data.get("timings") or {}).items():
            _merge_into(timings.setdefault(series, {}), buckets)
        _merge_into(gaps, data.get("step_gaps_ns") or {})
        # collections per process: vLLM names its engine core and worker processes
        name = str(data.get("process") or "")
        role = "engine_core" if "EngineCore" in name else "worker" if "Worker" in name else "api_server"
        _merge_into(gcs.setdefault(role, {}), data.get("gc_ns") or {})
        w = data.get("writes") or {}
        writes["n"] += int(w.get("n") or 0)
        writes["total_ns"] += int(w.get("total_ns") or 0)
        writes["max_ns"] = max(writes["max_ns"], int(w.get("max_ns") or 0))
        if data.get("drill_launched_at"):
            launched = {"ts": data["drill_launched_at"], "step": data.get("drill_step")}
    total["timings"] = timings
    total["step_gaps_ns"] = gaps
    total["gc_ns"] = gcs
    total["writes"] = writes
    total["drill"] = launched
    return total


def probe_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What the probe counted between two ``read_probe``s: step gaps, recorder timings and
    collections of that window only."""

    def sub(a: dict[str, Hist], b: dict[str, Hist]) -> dict[str, Hist]:
        return {k: hist_sub(h, b.get(k, {})) for k, h in a.items()}

    return {
        "step_gaps_ns": sub(after.get("step_gaps_ns") or {}, before.get("step_gaps_ns") or {}),
        "timings": {s: sub(b, (before.get("timings") or {}).get(s, {})) for s, b in (after.get("timings") or {}).items()},
        "gc_ns": {r: sub(b, (before.get("gc_ns") or {}).get(r, {})) for r, b in (after.get("gc_ns") or {}).items()},
        "schedule_calls": after.get("schedule_calls", 0) - before.get("schedule_calls", 0),
    }


def cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of one process, in seconds (None: gone or unreadable)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def cpu_us_per_token(before: float | None, after: float | None, tokens: int) -> float | None:
    """CPU microseconds a process spent per output token between two ``cpu_seconds`` readings
    (None: a reading missing or no token)."""
    if before is None or after is None or not tokens:
        return None
    return round(1e6 * (after - before) / tokens, 2)


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# ---- load ------------------------------------------------------------------------------------


@dataclass
class Result:
    index: int
    ok: bool = False
    prompt_len: int = 0
    tokens: int = 0
    chunks: list[float] = field(default_factory=list)  # arrival times of content chunks
    start: float = 0.0
    end: float = 0.0
    error: str | None = None
    scheduled: float | None = None  # an open loop's planned send time (its TTFT counts from it)
    # the output tokens so far at each chunk (``count_tokens``): vLLM merges a request's tokens
    # into one chunk when its API server is behind, so chunks are not tokens under load
    chunk_tokens: list[int] = field(default_factory=list)


def prompt_ids(i: int, length: int) -> list[int]:
    return [(7 * k + 13 * i) % 31000 + 100 for k in range(length)]


async def _one(
    host: str,
    port: int,
    model: str,
    i: int,
    prompt_len: int,
    max_tokens: int,
    tag: str,
    prompt: Sequence[int] | None = None,
    res: Result | None = None,
    count_tokens: bool = False,
) -> Result:
    """One streamed completion over a raw HTTP/1.0 connection (no chunked framing: the events
    arrive as the server writes them): each chunk's arrival time. ``prompt``: the token ids to
    send (default ``prompt_ids(i, prompt_len)``); ``res``: the result to fill (the caller keeps
    what arrived if it cancels the request); ``count_tokens``: ask for the usage in every chunk
    (``continuous_usage_stats``) and keep the running token count at each chunk."""
    res = res if res is not None else Result(index=i, prompt_len=prompt_len)
    stream_options = {"include_usage": True, **({"continuous_usage_stats": True} if count_tokens else {})}
    body = json.dumps(
        {
            "model": model,
            "prompt": list(prompt) if prompt is not None else prompt_ids(i, prompt_len),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": stream_options,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: {tag}{i:04d}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    res.start = time.time()
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        writer.write(head + body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(status.decode(errors="replace").strip())
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        while True:
            line = await reader.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                res.ok = True
                break
            now = time.time()
            msg = json.loads(data)
            usage = msg.get("usage")
            counted = bool(usage and usage.get("completion_tokens") is not None)
            if counted:
                res.tokens = int(usage["completion_tokens"])
            if msg.get("choices"):
                res.chunks.append(now)
                if count_tokens and counted:
                    res.chunk_tokens.append(res.tokens)
        writer.close()
    except Exception as exc:  # noqa: BLE001 - a failed request is a result
        res.error = repr(exc)
    res.end = time.time()
    return res


async def _run_load(base: str, model: str, items: Sequence[tuple[int, int]], max_tokens: int, concurrency: int, tag: str) -> list[Result]:
    host, port = base.removeprefix("http://").split(":")
    sem = asyncio.Semaphore(concurrency)

    async def go(i: int, plen: int) -> Result:
        async with sem:
            return await _one(host, int(port), model, i, plen, max_tokens, tag)

    return list(await asyncio.gather(*(go(i, p) for i, p in items)))


def _load_worker(args: tuple[str, str, list[tuple[int, int]], int, int, str]) -> list[dict[str, Any]]:
    base, model, items, max_tokens, concurrency, tag = args
    results = asyncio.run(_run_load(base, model, items, max_tokens, concurrency, tag))
    return [r.__dict__ for r in results]


def run_load(base: str, model: str, items: Sequence[tuple[int, int]], max_tokens: int, concurrency: int, tag: str, procs: int = 1) -> list[Result]:
    """``items`` (index, prompt length) at ``concurrency`` in flight, spread over ``procs``
    client processes so the client never is the bottleneck."""
    procs = max(1, min(procs, concurrency, len(items)))
    if procs == 1:
        return asyncio.run(_run_load(base, model, items, max_tokens, concurrency, tag))
    import multiprocessing

    shares = [list(items[k::procs]) for k in range(procs)]
    per = [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_load_worker, [(base, model, shares[k], max_tokens, per[k], tag) for k in range(procs)])
    return [Result(**d) for part in parts for d in part]


async def _closed_loop(base: str, model: str, first: int, isl: int, osl: int, concurrency: int, stop_at: float, tag: str) -> list[Result]:
    """``concurrency`` requests kept in flight until ``stop_at`` (wall time)."""
    host, port = base.removeprefix("http://").split(":")
    out: list[Result] = []

    async def lane(k: int) -> None:
        i = first + k
        while time.time() < stop_at:
            out.append(await _one(host, int(port), model, i, isl, osl, tag))
            i += concurrency

    await asyncio.gather(*(lane(k) for k in range(concurrency)))
    return out


def _closed_worker(args: tuple[str, str, int, int, int, int, float, str]) -> list[dict[str, Any]]:
    return [r.__dict__ for r in asyncio.run(_closed_loop(*args))]


def run_for(
    base: str, model: str, first: int, isl: int, osl: int, concurrency: int, seconds: float, tag: str, procs: int = 1
) -> tuple[list[Result], float]:
    """A closed loop at ``concurrency`` for ``seconds``, over ``procs`` client processes; returns
    the results and the loop's start (wall time)."""
    procs = max(1, min(procs, concurrency))
    start = time.time()
    stop_at = start + seconds
    per = [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]
    firsts = [first + 100_000 * k for k in range(procs)]
    if procs == 1:
        return asyncio.run(_closed_loop(base, model, first, isl, osl, concurrency, stop_at, tag)), start
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_closed_worker, [(base, model, firsts[k], isl, osl, per[k], stop_at, tag) for k in range(procs)])
    return [Result(**d) for part in parts for d in part], start


def window(results: Sequence[Result], t0: float, t1: float) -> dict[str, Any]:
    """Tokens per second and inter-token latency of the chunks that arrived in [t0, t1): the
    steady part of a closed loop (its ramp-up and drain left out). Each chunk is one token
    (vLLM streams every token); ``tokens_per_chunk`` checks it against the usage counts."""
    chunks = sum(1 for r in results for t in r.chunks if t0 <= t < t1)
    itl = [b - a for r in results for a, b in zip(r.chunks, r.chunks[1:], strict=False) if t0 <= b < t1]
    ok = [r for r in results if r.ok]
    per_chunk = sum(r.tokens for r in ok) / max(1, sum(len(r.chunks) for r in ok))
    return {
        "requests": len(results),
        "errors": sorted({r.error for r in results if r.error})[:3],
        "tok_s": round(chunks / (t1 - t0), 1) if t1 > t0 else None,
        "itl_p50_ms": None if not itl else round(1000 * (quantile(itl, 0.5) or 0), 3),
        "itl_p99_ms": None if not itl else round(1000 * (quantile(itl, 0.99) or 0), 3),
        "tokens_per_chunk": round(per_chunk, 3),
    }


def machine_facts(python: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count()}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        facts["gpu"] = out
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["gpu"] = repr(exc)
    code = (
        "import json,sys,torch,vllm; print(json.dumps({'python': sys.version.split()[0],"
        " 'torch': torch.__version__, 'cuda': torch.version.cuda, 'vllm': vllm.__version__}))"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=180).stdout.strip().splitlines()
        facts.update(json.loads(out[-1]) if out else {})
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        facts["versions_error"] = repr(exc)
    try:
        facts["kernel"] = os.uname().release
        facts["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    return facts
