"""Internal: the snapshot stage: the trigger policy, the open snapshots' life, the capture, the
document, the spool and the commit queue (``committer`` wires them)."""
