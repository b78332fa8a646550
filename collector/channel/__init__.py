"""The channel from the in-engine recorder to the sidecar: one memory-mapped ring file per
writing process, in the folder named by ``FLIGHTREC_RECORDER_DIR``.

Why a ring file (and not a socket or a queue): the writer is inside vLLM's per-step path and
must never block or fail when the sidecar is absent, slow or restarting; a store into a shared
mapping costs a memcpy. The kernel's page cache owns the bytes, so a SIGKILLed engine loses
nothing it had written, and a restarted sidecar re-reads what the ring still holds.
"""

from collector.channel.ringfile import RingCorrupt, RingReader, RingWriter

__all__ = ["RingCorrupt", "RingReader", "RingWriter"]
