"""The engine's NCCL, CUDA and vLLM environment, from each process's ``/proc/PID/environ`` (pure).

What a hang's reader asks first: was ``NCCL_DEBUG`` on, which transport (``NCCL_P2P_DISABLE``,
``NCCL_IB_*``, ``NCCL_NET_PLUGIN``, ``NCCL_SOCKET_IFNAME``), was there a watchdog
(``TORCH_NCCL_BLOCKING_WAIT``, ``TORCH_NCCL_ASYNC_ERROR_HANDLING``,
``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``), ``CUDA_LAUNCH_BLOCKING``, ``CUDA_VISIBLE_DEVICES``, the
ranks (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``), vLLM's own switches. The
fingerprint keeps a few of these from the API server; a wedge needs every process's, since a
worker may differ.

``environ`` is the environment the process was started with (what vLLM set in ``os.environ``
before it started a worker is in the worker's). Secrets are masked by name and by value
(``collector.redact``: ``VLLM_API_KEY``, a token in a URL).
"""

from __future__ import annotations

from collections.abc import Mapping

from collector.redact import redact

PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "VLLM_", "NVIDIA_", "PYTORCH_", "UCX_", "NVSHMEM_", "GLOO_", "NIXL_", "OMP_")
NAMES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "LD_LIBRARY_PATH"})
MAX_KEYS = 256
MAX_VALUE = 1000


def relevant(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that change how an engine hangs, sorted, secrets masked, values cut at
    ``MAX_VALUE`` characters, at most ``MAX_KEYS`` of them."""
    picked = {k: v[:MAX_VALUE] for k, v in environ.items() if k in NAMES or k.startswith(PREFIXES)}
    out = redact(dict(sorted(picked.items())[:MAX_KEYS]))
    return {str(k): str(v) for k, v in out.items()}


def split(per_process: Mapping[int, dict[str, str]], base_pid: int | None) -> tuple[dict[str, str], dict[int, dict[str, str | None]]]:
    """``(the engine's environment, per process what differs from it)``: the base is
    ``base_pid``'s (the engine core's, else the first read); a key a process lacks is None."""
    if not per_process:
        return {}, {}
    pid = base_pid if base_pid is not None and base_pid in per_process else next(iter(per_process))
    base = per_process[pid]
    diffs: dict[int, dict[str, str | None]] = {}
    for p, env in per_process.items():
        if p == pid:
            continue
        d: dict[str, str | None] = {k: v for k, v in env.items() if base.get(k) != v}
        d.update({k: None for k in base if k not in env})
        if d:
            diffs[p] = dict(sorted(d.items()))
    return base, diffs
