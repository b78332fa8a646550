"""Internal: the stacks of a wedged engine: every process of it (API server, engine core, workers) found
on this node, read twice with py-spy a few seconds apart without stopping them, compared thread
by thread, with what NVML said of its GPUs and its NCCL/CUDA environment at that moment.

- ``proc``: the node's processes as ``/proc`` shows them (pure parsers, then the reads);
- ``roles``: which part of the engine a process is, from vLLM's process titles;
- ``finder``: the engine's processes, from the recorder's pids and the process tree;
- ``permissions``: whether the sidecar may read them, decided before trying;
- ``pyspy``: one py-spy dump of one process, bounded in time, and its output parsed;
- ``causes``: why a process was not read, one line per cause, py-spy's errors translated;
- ``compare``: two dumps of a process, thread by thread: what moved, the blocking frame;
- ``environ``, ``gpus``, ``paths``: the environment, the GPUs' readings, a frame's file;
- ``part``: the snapshot document's ``stacks`` part;
- ``capture``: ``StackReader``, the coroutine that does all of the above off the event loop.
"""
