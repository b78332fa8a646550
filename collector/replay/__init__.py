"""Internal: replaying a snapshot's recorded load against an engine (``flightrec replay``)."""
