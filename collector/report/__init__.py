"""Internal: ``flightrec report``: a snapshot as an upstream bug report (Markdown) and as a redacted
archive small enough to attach (request ids hashed, no prompt content, secrets and hostnames
masked)."""
