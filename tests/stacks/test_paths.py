"""A frame's file without its install prefix, and the package it is in."""

from __future__ import annotations

import pytest

from collector.stacks.paths import is_stdlib, package_of, short_path


@pytest.mark.parametrize(
    ("path", "short", "package"),
    [
        ("/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", "vllm/v1/engine/core.py", "vllm"),
        ("/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "torch/distributed/distributed_c10d.py", "torch"),
        ("/usr/lib/python3.12/threading.py", "threading.py", "stdlib"),
        ("/opt/python/3.11.7/lib/python3.11/concurrent/futures/thread.py", "concurrent/futures/thread.py", "stdlib"),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6", None),
        ("/opt/conda/lib/libnccl.so.2.21.5", "libnccl.so.2.21.5", None),
        ("/srv/app/plugins/blocking_scheduler.py", "/srv/app/plugins/blocking_scheduler.py", None),
        ("<frozen runpy>", "<frozen runpy>", "stdlib"),
        (
            "/home/alice/.cache/vllm/torch_compile_cache/5f1c/rank_0_0/inductor_cache/ab/cab12.py",
            "torch_compile_cache/5f1c/rank_0_0/inductor_cache/ab/cab12.py",
            None,
        ),
    ],
)
def test_short_path_and_package(path: str, short: str, package: str | None) -> None:
    assert short_path(path) == short
    assert short_path(short_path(path)) == short  # a second pass changes nothing
    assert package_of(path) == package


def test_a_package_is_not_the_standard_library() -> None:
    assert is_stdlib("/usr/lib/python3.12/queue.py")
    assert not is_stdlib("/usr/lib/python3.12/site-packages/queue.py")
