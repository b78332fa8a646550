"""vLLM Flight Recorder: the last steps of every vLLM engine, frozen into a snapshot when it faults."""

__version__ = "0.1.0"
