"""scripts/check_vllm_api.py finds what the adapter needs and a release lacks: run on a small
vLLM source tree written here (the real wheels are checked by CI, .ci/run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

LOGGERS = """
from abc import ABC, abstractmethod
class StatLoggerBase(ABC):
    @abstractmethod
    def __init__(self, vllm_config, engine_index=0): ...
    @abstractmethod
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0, *, wave=0): ...
    @abstractmethod
    def log_engine_initialized(self): ...
    @abstractmethod
    def record_sleep_state(self, is_awake, level): ...
    def log(self): pass
def load_stat_logger_plugin_factories():
    if not isinstance(plugin_class, type) or not issubclass(
            plugin_class, StatLoggerBase
    ): raise TypeError
"""
SCHEDULER = """
class SchedulerInterface: pass
class Scheduler(SchedulerInterface):
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.running = []
        self.requests = {}
        self.connector = None
    def schedule(self): ...
    def update_from_output(self, scheduler_output, model_runner_output): ...
    def add_request(self, request): ...
    def _free_request(self, request, delay_free_blocks=False): ...
"""
REQUEST = """
from dataclasses import dataclass
class Request:
    def __init__(self, request_id):
        self.request_id = request_id
        self.num_prompt_tokens = 0
        self.num_preemptions = 0
        self.status = None
    @property
    def num_output_tokens(self): return 0
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_vllm_api", ROOT / "scripts" / "check_vllm_api.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_vllm_api"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_a_release_that_moved_things_is_reported() -> None:
    check = _script()
    src = check.Source(
        {
            "vllm/v1/metrics/loggers.py": LOGGERS.encode(),
            "vllm/v1/core/sched/scheduler.py": SCHEDULER.encode(),
            "vllm/v1/core/sched/async_scheduler.py": b"from vllm.v1.core.sched.scheduler import Scheduler\nclass AsyncScheduler(Scheduler): pass\n",
            "vllm/v1/request.py": REQUEST.encode(),
            "vllm/plugins/__init__.py": b'STAT_LOGGER_PLUGINS_GROUP = "vllm.stat_logger_plugins"\n',
            "vllm/version.py": b"__version__ = '9.9.9'\n",
        }
    )
    report = check.check("9.9.9", src, check.our_source())
    missing = "\n".join(report.missing)
    assert "`Request.num_computed_tokens`" in missing  # a field the rows cannot do without
    assert "_output_token_ids" not in missing  # the property is the other accepted name
    assert "vLLM's `Scheduler` has no `make_stats`" in missing  # an override of nothing
    assert "`FlightRecorderStatLogger.record` has no parameter 'wave'" in missing  # a new keyword
    assert "does not implement vLLM's abstract `StatLoggerBase.record_sleep_state`" in missing
    assert "`SchedulerConfig`" in missing  # a module that is not there at all
    assert "`Scheduler.running`" not in missing and "`AsyncScheduler`" not in missing  # inherited
    assert any("SchedulerStats" in a for a in report.absent)  # read defensively: reported, not failed
