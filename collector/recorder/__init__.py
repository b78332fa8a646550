"""The engine-side recorder: what runs inside an engine and writes its steps to the sidecar.

Usable without vLLM (``collector.vllm`` is the vLLM adapter over it; a load simulator or another
engine writes through the same classes, see docs/recorder.md)::

    from collector.recorder import EngineIdentity, RequestRecorder, StatsRecorder, status_code

- ``EngineIdentity``: who writes (the API server's pid, host and port; the name override).
- ``StatsRecorder.write_step``: one step's aggregates (ring role ``stats``).
- ``RequestRecorder.write_requests``: one step's running requests, as columns (role ``sched``);
  ``write_arrival`` / ``write_end``: the workload records of one request.
- both: ``write_fingerprint`` (deployment facts), ``write_event``, ``active``, ``failed``,
  ``close``.
"""

from __future__ import annotations

from collector.recorder.identity import EngineIdentity, engine_name
from collector.recorder.requests import RequestRecorder, status_code
from collector.recorder.stats import StatsRecorder

__all__ = ["EngineIdentity", "RequestRecorder", "StatsRecorder", "engine_name", "status_code"]
