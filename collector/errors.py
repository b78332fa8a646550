"""The project's exception tree. Every error we raise derives from ``FlightrecError``; errors of
the libraries beneath us (drivers, NVML, HTTP, the file system) are translated where they enter
(``raise OurError(...) from exc``) so callers catch ours, not theirs.

    FlightrecError
    ├── SettingsError                 collector.settings: one line per bad key
    ├── InputError (ValueError)       bad input from outside: set aside and counted, never fatal
    │   ├── CodecError                collector.channel.codec: a ring record that is not one of ours
    │   │   └── FieldError            collector.channel.fields: a field of the wrong type or range
    │   ├── MetricsParseError         collector.parsers.prom_text
    │   ├── ThroughputLineError       collector.parsers.throughput_line
    │   ├── CrashDumpParseError       collector.parsers.crash_dump
    │   ├── XidParseError             collector.xid.parser
    │   ├── XidCatalogError           collector.xid.catalog
    │   └── PlanError                 collector.replay.plan
    ├── RingCorrupt                   collector.channel.ringfile: a file that is not a ring we read
    ├── UnsafePathError (OSError)     collector.channel.secure: a folder or file we must not trust
    ├── StorageError                  collector.storage.connect: down, hung, or refused (``permanent``)
    │   └── NotFound                  collector.storage.repo: no such snapshot or incident
    ├── SpoolError                    collector.snapshot.spool: a spool file that is not whole
    ├── SourceError                   collector.sources.base: a source failed this round (retried)
    │   ├── SourceUnsupported         collector.sources.base: a source that cannot run here
    │   │   └── NvmlUnavailable       collector.sources.nvml_backend: no NVML library or driver
    │   ├── NvmlError                 collector.sources.nvml_backend
    │   │   ├── FieldNotSupported     this GPU cannot give this reading
    │   │   └── GpuLost               the GPU fell off the bus
    │   └── ScrapeError               collector.sources.vllm_metrics
    ├── IntentError                   collector.snapshot.intent: a trigger intent that is not whole
    ├── RecorderError (RuntimeError)  collector.vllm.extract: the recorder stops, the engine does not
    ├── ReplaySourceError (RuntimeError)  collector.replay.source: a snapshot that cannot be read
    ├── InspectLogError               collector.cli.inspect_log
    └── CliError                      collector.cli.common: one line and an exit code
"""

from __future__ import annotations

__all__ = ["FlightrecError", "InputError"]


class FlightrecError(Exception):
    """Base of every error this project raises."""


class InputError(FlightrecError, ValueError):
    """Input from outside (a ring record, a log line, a page, a file) that we do not accept."""
