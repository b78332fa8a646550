"""What a log record says happened: its text against the kinds' patterns, most specific first.
Pure; every regex carries a real line it matches."""

from __future__ import annotations

import re

from collector.model import EventKind

# (kind, pattern) in priority order; each regex carries a real line it matches.
_CLASSIFIERS: tuple[tuple[EventKind, re.Pattern[str]], ...] = (
    # torch.AcceleratorError: CUDA error: unspecified launch failure
    # RuntimeError: CUDA error: an illegal memory access was encountered
    # torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB ...
    # CUDA error: device-side assert triggered / cudaErrorLaunchFailure / CUDA driver error
    (
        EventKind.CUDA_ERROR,
        re.compile(
            r"CUDA error: |\bcudaError\w*|torch\.AcceleratorError|device-side assert triggered"
            r"|an illegal memory access was encountered|unspecified launch failure"
            r"|CUDA out of memory|CUDA driver error|CUBLAS_STATUS_(?!SUCCESS)\w+"
            r"|CUDNN_STATUS_(?!SUCCESS)\w+|misaligned address"
        ),
    ),
    # torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1970,
    #   unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
    # ncclUnhandledCudaError: Call to CUDA function failed.
    # [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, ...)
    # node:3107:3107 [0] NCCL WARN Cuda failure 'unspecified launch failure'
    (
        EventKind.NCCL_ERROR,
        re.compile(
            r"NCCL error|\bnccl(?:UnhandledCuda|System|Internal|InvalidUsage|InvalidArgument"
            r"|Remote)Error\b|NCCL WARN|DistBackendError|Watchdog caught collective operation"
            r" timeout|ProcessGroupNCCL.{0,80}(?:[Tt]imeout|[Ee]rror|abort)"
        ),
    ),
    # (EngineCore pid=14159) ERROR 11-30 14:46:02 [core.py:1512] EngineCore encountered a
    #   fatal error.
    (EventKind.ENGINE_FATAL, re.compile(r"EngineCore encountered a fatal error")),
    # vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack
    #   trace (above) for the root cause.
    # Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.
    # RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.
    # [shutdown] MPClient: engine core exited unexpectedly; starting cleanup
    # EngineCore failed to start. / WorkerProc failed to start.
    # RuntimeError: Engine core initialization failed. See root cause above.
    # RuntimeError: Process EngineCore_DP0 (PID: 77) died with exit code -9
    (
        EventKind.ENGINE_DEAD,
        re.compile(
            r"EngineDeadError|died unexpectedly|exited unexpectedly|EngineCore failed to start"
            r"|WorkerProc failed to start|Engine core initialization failed"
            r"|\(PID: \d+\) died with exit code"
        ),
    ),
)


def classify(text: str) -> list[EventKind]:
    """Every kind whose pattern occurs in ``text``, most specific first."""
    return [kind for kind, pattern in _CLASSIFIERS if pattern.search(text)]
