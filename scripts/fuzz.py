"""Fuzz every parser and the ring-record codec with mutations of real captured input.

Each target is fed ``--inputs`` inputs (default 100,000), each a real fixture (a kernel log
line, a crash-dump line, a ``/metrics`` page, an engine log, a ring record, a ring file) cut to a
window and mutated: bytes flipped, hostile characters inserted (quotes, backslashes, brackets,
NUL, huge digit runs, non-ASCII), spans deleted, duplicated, repeated into long lines, spliced
with another seed. Two properties are checked for each input:

- nothing escapes but the target's own error type (``CrashDumpParseError``, ``XidParseError``,
  ``MetricsParseError``, ``CodecError``, ...; none at all for parsers that never raise);
- the CPU time is linear: at most ``--budget`` microseconds a byte above a fixed allowance
  (an input over the bound is re-run three times and the fastest run counts, so a GC pause or a
  preempted core does not count as a failure).

It prints one row per target (inputs, largest input, max us/byte over inputs of 256 bytes or
more, failures) and writes each failing input to ``--out``. Deterministic for a ``--seed``.

    python scripts/fuzz.py                       # 100,000 inputs per target (about an hour)
    python scripts/fuzz.py --inputs 300 --only xid.parse_line
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from datetime import UTC

from collector.channel import codec  # noqa: E402
from collector.channel.naming import parse_ring_file_name  # noqa: E402
from collector.channel.ringfile import RingCorrupt, RingReader, RingWriter  # noqa: E402
from collector.model import Event, EventKind, Fingerprint, Severity, StepRecord  # noqa: E402
from collector.parsers import crash_dump, prom_text, throughput_line, tracebacks, vllm_log  # noqa: E402
from collector.redact import redact_text  # noqa: E402
from collector.snapshot import intent, spool  # noqa: E402
from collector.sources.vllm_metrics import WANTED  # noqa: E402
from collector.xid import parser as xid  # noqa: E402
from tests.request_columns import Row, encode_rows  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_BUDGET = 50.0  # CPU microseconds a byte: linear parsers cost 0.01-3, the quadratic ones cost 60-450
ALLOWANCE_US = 2000.0  # fixed cost of one call (imports warm, small allocations), not per byte
WINDOW = 2048  # most inputs are a window of a seed: long seeds would make 100k inputs take days
HOSTILE = [
    "'",
    '"',
    "\\",
    "\\'",
    '\\"',
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "<",
    ">",
    "\x00",
    "\n",
    "\r",
    "\t",
    " ",
    "é",
    "\u2028",
    "\udcff",
    "9" * 30,
    "9" * 5000,
    "-",
    ".",
    "e",
    "nan",
    "inf",
    "pid=",
    "name=",
    "NVRM: Xid (PCI:0000:00:06): ",
    "SchedulerOutput(",
    "SchedulerStats(",
    "\x1b[0;36m",
    "Traceback (most recent call last):",
    'File "',
]


SECRETS = [
    "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "redis://u:PW@cache:6379/0 postgresql://flight:p@ss@db/x",
    "Authorization: Bearer eyJhbGciOi.e30.sig",
    "vllm serve m --api-key sk-live-1234 --hf-token=hf_x --max-tokens 16",
    "non-default args: {'model': 'q', 'api_key': ['sk-abcdef123'], 'port': 8000}",
    'EngineArgs(api_key=\'k-9d8f7\', max_num_seqs=8) password: hunter2 {"token": "x"} hf_abc123',
]


@dataclass
class Target:
    name: str
    run: Callable[[str], object]
    allowed: tuple[type[BaseException], ...]
    seeds: list[str]
    binary: bool = False  # inputs are bytes, carried as latin-1 text


@dataclass
class Result:
    inputs: int = 0
    largest: int = 0
    max_us_per_byte: float = 0.0
    failures: list[str] = field(default_factory=list)


def _lines(paths: Iterable[Path], marker: str = "") -> list[str]:
    out: list[str] = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        out.extend(line for line in text.splitlines() if marker in line)
    return out


def _dump_bodies(marker: str) -> list[str]:
    return [line.split(marker, 1)[1] for line in _lines(sorted((FIXTURES / "vllm-logs").glob("*.log")), marker)]


def _ring_seed() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "e.ring"
        writer = RingWriter(path, capacity=4096)
        for payload in _codec_seeds_bytes()[:6]:
            writer.append(payload)
        writer.close()
        return path.read_bytes().decode("latin-1")


def _codec_seeds_bytes() -> list[bytes]:
    rows = [Row("cmpl-a-0", 32000, 32512, 512, 0, "running", 8), Row("b", 5, 5, 1, 2, "preempted")]
    step = StepRecord(
        engine="d",
        ts=1.7e9,
        step=812,
        running=2,
        waiting=3,
        kv_cache_usage=0.032,
        waiting_by_reason={"capacity": 2, "deferred": 1},
        connector={"mirror_rows": 12},
        worker="Worker_TP1",
    )
    event = Event(
        kind=EventKind.CUDA_ERROR,
        ts=1.7e9,
        source="recorder",
        message="CUDA error: unspecified",
        severity=Severity.CRITICAL,
        engine="d",
        gpu="0000:00:06.0",
        xid=43,
        pid=415,
        frames=[{"file": "a.py", "line": 1}],
        lines=["x"],
    )
    return [
        codec.encode_step_fields(812, 1.7e9, 0, 4, 7, 2, 0.032, 1, 300, 16, 2, 640, 128),
        codec.encode_step(step),
        encode_rows(77, 3.5, rows),
        codec.encode_event(event),
        codec.encode_fingerprint(Fingerprint(engine="d", ts=1.0, facts={"block_size": 64, "tp": 2})),
        codec.encode({"t": "meta", "engine": "decode-0", "engine_index": 0, "role": "stats", "pid": 1234}),
        codec.encode_arrival("cmpl-1", 1.0, 32000, 2000, None, True, None),
        codec.encode_end("cmpl-1", 2.0, 2000, "length", None),
    ]


def _decode(text: str) -> object:
    return codec.decode(text.encode("latin-1"))


def _ring(text: str) -> object:
    fd, name = tempfile.mkstemp(suffix=".ring")
    try:
        os.write(fd, text.encode("latin-1"))
        os.close(fd)
        reader = RingReader(name)
        try:
            return reader.read()
        finally:
            reader.close()
    finally:
        os.unlink(name)


def _decode_many(text: str) -> object:
    """A poll's batch: the mutated record beside a plain S record (the batch path's fast lane),
    and its first half; errors come back per record, never raised."""
    raw = text.encode("latin-1")
    good = codec.encode_step_fields(1, 1.7e9, 0, 4, 7, 2, 0.032, 1, 300, 16, 2, 640, 128)
    return codec.decode_many([raw, good, raw[: len(raw) // 2], good], engine="d")


def _file_reader(read: Callable[[Path], object], suffix: str) -> Callable[[str], object]:
    def run(text: str) -> object:
        fd, name = tempfile.mkstemp(suffix=suffix)
        try:
            os.write(fd, text.encode("latin-1"))
            os.close(fd)
            return read(Path(name))
        finally:
            os.unlink(name)

    return run


def _spool_seed() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = spool.write(
            Path(tmp),
            "snapshot-1.0-decode-0-x.spool",
            {"engine": "decode-0", "trigger": {"kind": "xid"}},
            {"incident_key": "k", "trigger_uid": "u"},
            {"steps": b"\x1f\x8b" + b"x" * 40, "events": b"[]"},
        )
        return path.read_bytes().decode("latin-1")


def _intent_seed() -> str:
    ev = Event(kind=EventKind.XID, ts=1.7e9, source="kmsg", message="NVRM: Xid 43", engine="decode-0", uid="abc", xid=43)
    return intent.encode("decode-0", ev, 1.7e9).decode("latin-1")


def _eventize(text: str) -> object:
    ev = tracebacks.LogEventizer("decode-0", reference_clock=lambda: 1.7e9)
    out = [e for line in text.split("\n") for e in ev.feed(line)]
    return out + ev.flush()


def _timestamp(text: str) -> object:
    from datetime import datetime

    return vllm_log.parse_timestamp(text, datetime(2026, 12, 1, tzinfo=UTC))


def targets() -> list[Target]:
    logs = sorted((FIXTURES / "vllm-logs").glob("*.log"))
    kmsg = _lines([FIXTURES / "kmsg-h200-xid.txt", FIXTURES / "dmesg-h200-xid-drill.txt"])
    pages = [p.read_text() for p in sorted((FIXTURES / "vllm-metrics").glob("*.txt"))]
    outputs = _dump_bodies("Dumping scheduler output for model execution: ")
    stats = _dump_bodies("Dumping scheduler stats: ")
    log_lines = _lines(logs)
    log_text = ["\n".join(log_lines[i : i + 60]) for i in range(0, len(log_lines), 60)]
    codec_seeds = [b.decode("latin-1") for b in _codec_seeds_bytes()]
    own_dump, own_xid = (crash_dump.CrashDumpParseError,), (xid.XidParseError,)
    return [
        Target("crash_dump.parse_repr", crash_dump.parse_repr, own_dump, outputs + stats),
        Target("crash_dump.parse_scheduler_output", crash_dump.parse_scheduler_output, own_dump, outputs),
        Target("crash_dump.parse_scheduler_stats", crash_dump.parse_scheduler_stats, own_dump, stats),
        Target("xid.parse_line", xid.parse_line, own_xid, kmsg),
        Target("xid.normalize_bus_id", xid.normalize_bus_id, own_xid, ["0000:00:06", "00000000:00:06.0", "cb:00"]),
        Target("prom_text.parse", lambda t: prom_text.parse(t, WANTED), (prom_text.MetricsParseError,), pages),
        Target(
            "throughput_line.parse",
            throughput_line.parse_throughput_line,
            (throughput_line.ThroughputLineError,),
            _lines(logs, "Avg prompt throughput"),
        ),
        Target("vllm_log.parse_line", vllm_log.parse_line, (), log_lines),
        Target("vllm_log.parse_timestamp", _timestamp, (), ["11-30 14:39:22", "01-01 00:00:00", "02-29 23:59:59"]),
        Target("tracebacks.LogEventizer", _eventize, (), log_text),
        Target("tracebacks.parse_frames", lambda t: tracebacks.parse_frames(t.split("\n")), (), log_text),
        Target("naming.parse_ring_file_name", parse_ring_file_name, (), ["decode-0.stats.1234.ring", "decode-0.sched.99.ring", "a.b.c.ring"]),
        Target("codec.decode (JSON)", _decode, (codec.CodecError,), [s for s in codec_seeds if s[0] == "J"], binary=True),
        Target("codec.decode (binary S/R)", _decode, (codec.CodecError,), [s for s in codec_seeds if s[0] != "J"], binary=True),
        Target("ringfile.RingReader", _ring, (RingCorrupt,), [_ring_seed()], binary=True),
        Target("codec.decode_many", _decode_many, (), codec_seeds, binary=True),
        Target("spool.read", _file_reader(spool.read, ".spool"), (spool.SpoolError,), [_spool_seed()], binary=True),
        Target("intent.read", _file_reader(intent.read, ".intent"), (intent.IntentError,), [_intent_seed()], binary=True),
        Target("redact.redact_text", redact_text, (), SECRETS + log_lines[:200]),
    ]


def mutate(rng: random.Random, seeds: list[str], *, binary: bool) -> str:
    seed = rng.choice(seeds)
    if len(seed) > WINDOW and not binary and rng.random() < 0.97:
        start = rng.randrange(len(seed))
        seed = seed[start : start + rng.randint(1, WINDOW)]
    text = list(seed)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        n = len(text)
        at = rng.randint(0, n)
        if op < 0.3 and n:
            at = min(at, n - 1)
            text[at : at + 1] = list(chr(rng.randrange(256)) if binary else rng.choice(HOSTILE))
        elif op < 0.55:
            piece = chr(rng.randrange(256)) if binary else rng.choice(HOSTILE)
            text[at:at] = list(piece)
        elif op < 0.7 and n:
            del text[at : at + rng.randint(1, 64)]
        elif op < 0.8 and n:
            span = text[at : at + rng.randint(1, 32)]
            text[at:at] = span * rng.randint(2, 8)
        elif op < 0.83 and n:
            # a long run of one fragment: what turns a quadratic scan into a stall
            if binary or rng.random() < 0.5:
                span = text[at : at + rng.randint(1, 4)] or ["'"]
            else:
                span = list(rng.choice(HOSTILE[:20]) + rng.choice(HOSTILE[:20]))
            text[at:at] = span * (rng.randint(2_000, 20_000) // len(span))
        elif op < 0.9:
            other = rng.choice(seeds)
            cut = rng.randint(0, len(other))
            text[at:] = list(other[cut : cut + WINDOW])
        elif n:
            del text[at:]
    out = "".join(text)
    return out if not binary else "".join(chr(ord(c) & 0xFF) for c in out)


def _cost(run: Callable[[str], object], text: str, allowed: tuple[type[BaseException], ...]) -> tuple[float, str]:
    start = time.process_time()
    try:
        run(text)
    except allowed:
        pass
    except Exception as exc:  # noqa: BLE001 - what the fuzzer exists to find
        return (time.process_time() - start) * 1e6, f"{type(exc).__name__}: {str(exc)[:120]}"
    return (time.process_time() - start) * 1e6, ""


def fuzz(target: Target, inputs: int, *, seed: int, budget: float, out: Path | None) -> Result:
    rng = random.Random(f"{seed}:{target.name}")
    result = Result()
    for i in range(inputs):
        text = mutate(rng, target.seeds, binary=target.binary)
        us, error = _cost(target.run, text, target.allowed)
        size = max(len(text), 1)
        if not error and us > ALLOWANCE_US + budget * size:
            us = min(us, *(_cost(target.run, text, target.allowed)[0] for _ in range(3)))
            if us > ALLOWANCE_US + budget * size:
                error = f"slow: {us / size:.0f} us/byte over {size} bytes"
        result.inputs += 1
        result.largest = max(result.largest, size)
        if size >= 256:
            result.max_us_per_byte = max(result.max_us_per_byte, us / size)
        if error:
            result.failures.append(error)
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                slug = target.name.replace(" ", "_").replace("/", "_")
                (out / f"{slug}-{i}.txt").write_bytes(text.encode("utf-8", "surrogatepass"))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000, help="inputs per target")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="microseconds of CPU a byte allowed")
    ap.add_argument("--only", action="append", default=[], help="target name (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="folder for failing inputs")
    args = ap.parse_args(argv)
    by_name = {t.name: t for t in targets()}
    unknown = [name for name in args.only if name not in by_name]
    if unknown:
        ap.error(f"no target named {', '.join(unknown)}; targets: {', '.join(by_name)}")
    chosen = [by_name[name] for name in args.only] if args.only else list(by_name.values())  # in --only's order
    print(f"{'target':<36} {'inputs':>8} {'largest':>8} {'max us/B':>9} {'failures':>8}  seconds", flush=True)
    failed = 0
    for target in chosen:
        started = time.monotonic()
        res = fuzz(target, args.inputs, seed=args.seed, budget=args.budget, out=args.out)
        failed += len(res.failures)
        print(
            f"{target.name:<36} {res.inputs:>8} {res.largest:>8} {res.max_us_per_byte:>9.2f} "
            f"{len(res.failures):>8}  {time.monotonic() - started:.0f}",
            flush=True,
        )
        for kind in sorted(set(res.failures))[:5]:
            print(f"    {kind}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
