"""vLLM Flight Recorder: the last steps of every vLLM engine, frozen into a snapshot when it faults.

What users and other programs may rely on is listed in docs/public-surface.md; every other
module says ``Internal:`` in its docstring (or its package's)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
