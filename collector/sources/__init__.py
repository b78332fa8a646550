"""Internal: the sidecar's sources: one module each, listed in ``collector.sources.registry``."""
