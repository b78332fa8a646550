"""Internal: ingest, the sidecar's memory of what its sources read: each engine's step window,
workload log, scrapes, log lines and events, filed through one door (``Intake.emit``) and read
through ``IngestView``."""
