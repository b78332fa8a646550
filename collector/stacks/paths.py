"""A frame's file as a report shows it: no install prefix (pure).

``/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py`` and
``/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py`` are both
``vllm/v1/engine/core.py``; the standard library's ``/usr/lib/python3.12/threading.py`` is
``threading.py``; a native library ``/usr/lib/x86_64-linux-gnu/libc.so.6`` is ``libc.so.6``.
Code that vLLM generates at start-up (``torch.compile``'s inductor output under
``~/.cache/vllm/torch_compile_cache/<hash>/...``) is ``torch_compile_cache/<hash>/...``: the
home folder (and the user's name in it) is not kept. A file under no known prefix (the site's
own code, a plugin) is kept as it is.
"""

from __future__ import annotations

import re

_SITE = re.compile(r"/(?:site|dist)-packages/(?P<rel>.+)$")
_STDLIB = re.compile(r"/lib/python3(?:\.\d+)?t?/(?P<rel>.+)$")
_LIBRARY = re.compile(r"\.so(?:\.\d+)*$")
_COMPILED = re.compile(r"/(?P<rel>torch_compile_cache/.+)$")


def short_path(path: str) -> str:
    m = _SITE.search(path) or _STDLIB.search(path) or _COMPILED.search(path)
    if m is not None:
        return m.group("rel")
    if _LIBRARY.search(path):
        return path.rsplit("/", 1)[-1]
    return path


def is_stdlib(path: str) -> bool:
    """Whether a frame's file is Python's own library (not a package installed into it)."""
    return _SITE.search(path) is None and _STDLIB.search(path) is not None


def package_of(path: str) -> str | None:
    """``"stdlib"`` for Python's own library, the top-level package of a file installed under
    site-packages (``zmq``, ``torch``, ``vllm``), None for any other file (the site's own code)."""
    m = _SITE.search(path)
    if m is not None:
        return m.group("rel").split("/", 1)[0]
    return "stdlib" if _STDLIB.search(path) is not None or path.startswith("<frozen") else None
