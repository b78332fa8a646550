"""Python's traceback grammar as vLLM's logs carry it: ``Traceback ...``, ``File`` lines with their
code, the exception line, torch's hint lines, chained ``During handling ...`` sections. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_TB_START = "Traceback (most recent call last):"
_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# At most 9 digits in a number we int(): a longer run is not a line number or exit code, and
# int() of a 5,000-digit one raises ValueError (found by scripts/fuzz.py).
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d{1,9})(?:, in (?P<func>.+))?$')
# Lines torch appends to a CUDA error message (they follow the exception line).
_EXC_TAIL = re.compile(
    r"^(?:CUDA kernel errors might be|For debugging consider passing|Compile with "
    r"`TORCH_USE_CUDA_DSA`|Search for `cudaError|Exception raised from |frame #\d+:|"
    r"\[Previous line repeated)"
)


def parse_frames(messages: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Traceback lines (header removed) -> (frames, exception texts of the chain).

    Each frame is ``{"file", "line", "func", "code", "chain"}``; ``chain`` numbers the
    sections of a chained traceback (0 for the first of a ``During handling ...`` chain).
    vLLM 0.32's ``WorkerProc hit an exception.`` record prints the same traceback twice in a
    row: a section identical to the one before it is dropped.
    """
    sections: list[tuple[list[dict[str, Any]], list[str]]] = []
    frames: list[dict[str, Any]] = []
    exc: list[str] = []
    in_frames = False

    def close() -> None:
        nonlocal frames, exc
        if frames or exc:
            sections.append((frames, exc))
        frames, exc = [], []

    for raw in messages:
        msg = raw.rstrip()
        stripped = msg.strip()
        if stripped == _TB_START:
            close()
            in_frames = True
            continue
        if stripped in _CHAIN:
            close()
            in_frames = False
            continue
        m = _FRAME.match(msg)
        if m is not None:
            frames.append(
                {
                    "file": m.group("file"),
                    "line": int(m.group("line")),
                    "func": m.group("func"),
                    "code": None,
                }
            )
            in_frames = True
            continue
        if not stripped:
            continue
        if in_frames and msg[:1].isspace():
            # Code under a frame; skip the ^^^^ / ~~~~ markers of Python 3.11.
            if frames and frames[-1]["code"] is None and set(stripped) - set("^~ "):
                frames[-1]["code"] = stripped
            continue
        if in_frames or not exc:
            exc.append(stripped)  # the exception line
            in_frames = False
        else:
            exc[-1] = exc[-1] + "\n" + stripped  # torch's multi-line messages
    close()

    out_frames: list[dict[str, Any]] = []
    exceptions: list[str] = []
    previous: tuple[list[dict[str, Any]], list[str]] | None = None
    chain = 0
    for section in sections:
        if section == previous:
            continue
        previous = section
        for frame in section[0]:
            out_frames.append({**frame, "chain": chain})
        exceptions.extend(section[1][:1])
        chain += 1
    return out_frames, exceptions
