"""The stacks' settings (mounted by the application settings as ``stacks:``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StacksSettings(BaseModel):
    model_config = {"extra": "forbid"}

    enabled: bool = Field(default=True, description="read every engine process's stacks when an engine wedges")
    interval_s: float = Field(default=3.0, ge=0.5, le=60, description="seconds between the two dumps that show which frames moved")
    timeout_s: float = Field(default=5.0, gt=0, le=120, description="a py-spy run past this is killed (a dump takes 0.1-0.2 s)")
    native: bool = Field(
        default=False,
        description="the second dump with --native (C/C++ frames: the CUDA or NCCL call under torch). py-spy cannot unwind "
        "native frames without stopping the process: each is paused for that dump (0.1-0.3 s measured with torch loaded; a "
        "native dump of a real vLLM process takes 1.4-1.7 s: BENCHMARKS.md); refused or failed, the Python frames are read without it",
    )
    py_spy: str | None = Field(default=None, description="the py-spy binary; default: the one installed beside the sidecar, else PATH")
    max_processes: int = Field(default=64, ge=1, le=1024, description="processes of one engine read at most")
    parallel: int = Field(default=8, ge=1, le=64, description="py-spy runs at once (its own threads: the snapshot's never wait on them)")
