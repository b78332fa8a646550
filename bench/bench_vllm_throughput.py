"""The engine's tokens per second with and without the in-engine recorder, on a real vLLM.

Run with the vLLM virtualenv's python, from the repository root (it imports vLLM)::

    PYTHONPATH=$PWD $FLIGHTREC_VLLM_PYTHON bench/bench_vllm_throughput.py [--rounds 8]

It starts two engines side by side, each in its own worker process:

- ``with``: the stat logger (``FlightRecorderStatLogger``) and
  ``scheduler_cls=collector.vllm.RecordingScheduler``;
- ``without``: no recorder and vLLM's own scheduler.

``--engine inprocess`` (the default) runs vLLM's ``LLMEngine`` with the engine core inside the
worker (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the stat logger passed as ``stat_loggers``: one
process, so its CPU time is the engine's, exactly, which other work on a shared machine barely
moves. ``--engine async`` runs ``AsyncLLM`` as vLLM's API server does (stat loggers in the
worker, loaded from the entry point with ``VLLM_PLUGINS=flightrec``, the engine core in a child
process); on a busy 2-core machine its rounds vary ten-fold.

Both get the same tiny Llama (random weights, nothing downloaded) and the same workload per
round: ``--concurrency`` requests at once, ``--prompt`` random prompt tokens, ``--output`` tokens
each (``ignore_eos``). ``--calibrate`` runs both sides without the recorder, to show what ratio the
setup itself gives on the machine at hand. Rounds alternate between the two engines in ABBA order, so a load that
drifts over the run (other work on the machine) falls on both alike; only one engine works at a
time. It prints each round's tokens per second, the median of each side, and the median of the
paired ratios (with / without), in wall time and in engine CPU time (this process and the
engine core: on a shared machine, other work inflates wall time far more than CPU time). At the
end it counts the records the recorder wrote, to show the ``with`` figure did record every step. Nothing here asserts a time; figures go into
BENCHMARKS.md by hand, with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MARK = "FLIGHTREC-BENCH "


# -- worker: one engine, rounds on request ------------------------------------------------------
async def _round(engine: Any, args: argparse.Namespace, round_no: int) -> dict[str, float]:
    from vllm.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=args.output, ignore_eos=True, temperature=0.0)
    rng = random.Random(round_no)

    async def one(i: int) -> int:
        prompt = [rng.randrange(3, 1000) for _ in range(args.prompt)]
        last = None
        async for out in engine.generate({"prompt_token_ids": prompt}, sp, request_id=f"r{round_no}-{i}"):
            last = out
        return len(last.outputs[0].token_ids) if last is not None else 0

    cpu0 = _tree_cpu()
    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(args.concurrency))))
    return {"tokens": tokens, "seconds": time.perf_counter() - t0, "cpu_seconds": _tree_cpu() - cpu0}


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and its children (the engine core): what the
    engine spent, which other work on a shared machine inflates far less than wall time."""
    import psutil  # a vLLM dependency

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _serve_inprocess(args: argparse.Namespace) -> None:
    """The engine core in this very process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, vLLM's
    ``LLMEngine``): one process, so its CPU time is exactly the engine's."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    extra: dict[str, Any] = {}
    loggers: list[Any] = []
    if args.worker == "with":
        from collector.vllm.plugin import FlightRecorderStatLogger  # what the entry point loads

        extra["scheduler_cls"] = "collector.vllm.RecordingScheduler"
        loggers.append(FlightRecorderStatLogger)
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=args.model,
            load_format="dummy",
            skip_tokenizer_init=True,
            max_model_len=2048,
            dtype="bfloat16",
            enforce_eager=args.eager,
            disable_log_stats=False,
            **extra,
        ),
        stat_loggers=loggers,
    )
    sp = SamplingParams(max_tokens=args.output, ignore_eos=True, temperature=0.0)

    def one_round(round_no: int) -> dict[str, float]:
        rng = random.Random(round_no)
        for i in range(args.concurrency):
            engine.add_request(f"r{round_no}-{i}", {"prompt_token_ids": [rng.randrange(3, 1000) for _ in range(args.prompt)]}, sp)
        cpu0, t0, tokens = time.process_time(), time.perf_counter(), 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens += len(out.outputs[0].token_ids)
        return {"tokens": tokens, "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0}

    one_round(-1)  # warm-up, not reported
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        print(MARK + json.dumps(one_round(int(line))), flush=True)


async def _serve(args: argparse.Namespace) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    extra: dict[str, Any] = {}
    if args.worker == "with":
        extra["scheduler_cls"] = "collector.vllm.RecordingScheduler"
    engine_args = AsyncEngineArgs(
        model=args.model,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=2048,
        dtype="bfloat16",
        enforce_eager=args.eager,
        **extra,
    )
    engine = AsyncLLM.from_engine_args(engine_args)
    await _round(engine, args, -1)  # warm-up, not reported
    print(MARK + json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        print(MARK + json.dumps(await _round(engine, args, int(line))), flush=True)
    engine.shutdown()


# -- parent: two workers, interleaved rounds ----------------------------------------------------
def _reply(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])  # type: ignore[no-any-return]
    raise RuntimeError(f"worker exited with {proc.wait()}")


def _start(mode: str, args: argparse.Namespace, model: Path, recdir: Path, log: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    # One OpenMP thread per engine: with two on a machine whose cores other work takes, a
    # descheduled thread leaves the other spinning at barriers, which made identical rounds
    # differ ten-fold in wall and CPU time alike.
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if args.engine == "inprocess" else "1",
            "VLLM_PLUGINS": "flightrec" if mode == "with" else "",
            "FLIGHTREC_RECORDER_DIR": str(recdir),
        }
    )
    env.pop("FLIGHTREC_ENGINE_NAME", None)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        "--model",
        str(model),
        "--concurrency",
        str(args.concurrency),
        "--prompt",
        str(args.prompt),
        "--output",
        str(args.output),
        "--engine",
        args.engine,
    ] + (["--eager"] if args.eager else [])
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env, start_new_session=True
    )  # its own group: the engine core goes with it


def _count_records(recdir: Path) -> dict[str, Any]:
    from collector.channel.ringfile import RingReader

    out: dict[str, Any] = {"files": []}
    for path in sorted(recdir.glob("*.ring")):
        payloads = RingReader(path).read(1_000_000)
        meta = json.loads(payloads[0][1:]) if payloads and payloads[0][:1] == b"J" else {}
        out["files"].append(
            {
                "name": path.name,
                "engine": meta.get("engine"),
                "server_pid": meta.get("server_pid"),
                "S": sum(1 for p in payloads if p[:1] == b"S"),
                "R": sum(1 for p in payloads if p[:1] == b"R"),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="measured rounds per engine")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (faster start, same for both)")
    ap.add_argument(
        "--engine",
        choices=("inprocess", "async"),
        default="inprocess",
        help="inprocess: LLMEngine with the engine core in the worker (exact CPU time); "
        "async: AsyncLLM with the engine core in a child process, as vLLM's server runs it",
    )
    ap.add_argument("--calibrate", action="store_true", help="both engines without the recorder: the ratio the setup itself gives (ideally 1)")
    ap.add_argument("--worker", choices=("with", "without"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.engine == "inprocess":
            _serve_inprocess(args)
        else:
            asyncio.run(_serve(args))
        return

    work = Path(tempfile.mkdtemp(prefix="flightrec-tput-"))
    model = work / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    recdir = work / "rec"
    # "with" and "without" name the two sides; under --calibrate both run without the recorder
    procs = {m: _start("without" if args.calibrate else m, args, model, recdir, work / f"{m}.log") for m in ("with", "without")}
    try:
        for m, p in procs.items():
            _reply(p)
            print(f"{m}: engine ready", flush=True)
        rates: dict[str, list[float]] = {"with": [], "without": []}
        cpu_rates: dict[str, list[float]] = {"with": [], "without": []}
        order = ["with", "without", "without", "with"]
        for r in range(2 * args.rounds):
            mode = order[r % 4]
            proc = procs[mode]
            assert proc.stdin is not None
            proc.stdin.write(f"{r}\n")
            proc.stdin.flush()
            res = _reply(proc)
            rate = res["tokens"] / res["seconds"]
            rates[mode].append(rate)
            cpu_rates[mode].append(res["tokens"] / res["cpu_seconds"])
            print(
                f"round {r:2d} {mode:7s} {res['tokens']} tokens in {res['seconds']:.2f} s: {rate:.1f} tok/s, "
                f"{res['cpu_seconds']:.2f} CPU s: {cpu_rates[mode][-1]:.1f} tok/CPU-s",
                flush=True,
            )
        pairs = [w / wo for w, wo in zip(rates["with"], rates["without"], strict=True)]
        cpu_pairs = [w / wo for w, wo in zip(cpu_rates["with"], cpu_rates["without"], strict=True)]
        med_w, med_wo = statistics.median(rates["with"]), statistics.median(rates["without"])
        print(
            json.dumps(
                {
                    "with_median_tok_s": round(med_w, 1),
                    "without_median_tok_s": round(med_wo, 1),
                    "ratio_of_medians": round(med_w / med_wo, 4),
                    "median_paired_ratio": round(statistics.median(pairs), 4),
                    "paired_ratio_range": [round(min(pairs), 4), round(max(pairs), 4)],
                    "with_median_tok_per_cpu_s": round(statistics.median(cpu_rates["with"]), 1),
                    "without_median_tok_per_cpu_s": round(statistics.median(cpu_rates["without"]), 1),
                    "cpu_median_paired_ratio": round(statistics.median(cpu_pairs), 4),
                    "cpu_paired_ratio_range": [round(min(cpu_pairs), 4), round(max(cpu_pairs), 4)],
                    "rounds": args.rounds,
                    "concurrency": args.concurrency,
                    "prompt": args.prompt,
                    "output": args.output,
                    "eager": args.eager,
                    "calibrate": args.calibrate,
                    "engine": args.engine,
                },
                indent=1,
            )
        )
    finally:
        for p in procs.values():
            if p.stdin is not None and p.poll() is None:
                try:
                    p.stdin.write("quit\n")
                    p.stdin.flush()
                except BrokenPipeError:
                    pass
        for p in procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    print(json.dumps(_count_records(recdir), indent=1))


if __name__ == "__main__":
    main()
