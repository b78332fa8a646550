"""Internal: the recorder's few settings, read from the environment of the engine it runs in.

The recorder runs inside every vLLM process, so it reads its settings here and imports nothing
of the sidecar's (``collector.settings`` would bring pydantic-settings, YAML, the alerting and the
detectors into vLLM's start). The sidecar's settings take their defaults from these functions, so
both sides agree on the folder.

- ``FLIGHTREC_RECORDER_DIR``: the folder of the ring files (default ``default_recorder_dir()``).
- ``FLIGHTREC_ENGINE_NAME``: the engine's name, overriding ``vllm-<server pid>``.
- ``FLIGHTREC_POD_UID``: the engine's pod UID (the downward API's ``metadata.uid``), so that its
  rings join the pod the sidecar discovered; without it the recorder reads its own cgroup.
- ``FLIGHTREC_RECORDER_ANY_VLLM``: ``1`` records under a vLLM outside the supported versions
  (``collector.vllm._version``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

RECORDER_DIR_ENV = "FLIGHTREC_RECORDER_DIR"
ENGINE_NAME_ENV = "FLIGHTREC_ENGINE_NAME"
ANY_VLLM_ENV = "FLIGHTREC_RECORDER_ANY_VLLM"
POD_UID_ENV = "FLIGHTREC_POD_UID"


def default_recorder_dir() -> Path:
    """``/dev/shm/flightrec`` where there is a /dev/shm (RAM: a ring write is a memcpy, and the
    bytes outlive a killed engine), else ``<tmp>/flightrec``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / "flightrec"
    return Path(tempfile.gettempdir()) / "flightrec"


def recorder_dir_from_env(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    value = env.get(RECORDER_DIR_ENV)
    return Path(value) if value else default_recorder_dir()


def engine_name_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(ENGINE_NAME_ENV) or None


def pod_uid_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    value = env.get(POD_UID_ENV, "").strip().lower()
    return value or None


def any_vllm_from_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ANY_VLLM_ENV, "").strip().lower() in ("1", "true", "yes")
