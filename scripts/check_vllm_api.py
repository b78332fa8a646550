"""Check that every vLLM class, attribute and signature the recorder's adapter (``collector/vllm/``)
relies on exists in given vLLM releases, by reading each release's wheel: its Python source is
parsed with ``ast`` out of the zip, nothing of vLLM is imported or installed.

    python scripts/check_vllm_api.py --versions 0.26.0 0.32.0 0.34.0 --dir /tmp/vllm-wheels
    python scripts/check_vllm_api.py path/to/vllm-0.34.0-*.whl

Wheels missing from ``--dir`` are fetched with ``pip download --no-deps vllm==V`` (~250-330 MB
each). Prints one Markdown report (docs/vllm-versions.md keeps the last one): per release, what
the adapter needs and does not find (exit status 1), and what it reads defensively and does not
find (recorded as unknown, so reported, not failed). The overrides of ``RecordingScheduler`` and
``FlightRecorderStatLogger`` are compared with the methods they override: vLLM's every parameter
must be accepted, and vLLM's abstract methods implemented.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (module file, class, members): what the adapter cannot do without. A member "a|b" is met by
# either name.
REQUIRED: list[tuple[str, str, tuple[str, ...]]] = [
    ("vllm/v1/metrics/loggers.py", "StatLoggerBase", ("__init__", "record", "log_engine_initialized")),
    (
        "vllm/v1/core/sched/scheduler.py",
        "Scheduler",
        ("schedule", "update_from_output", "make_stats", "add_request", "_free_request", "running", "requests", "vllm_config", "connector"),
    ),
    ("vllm/v1/core/sched/async_scheduler.py", "AsyncScheduler", ("schedule", "update_from_output")),
    ("vllm/config/scheduler.py", "SchedulerConfig", ("async_scheduling", "scheduler_cls", "get_scheduler_cls")),
    (
        "vllm/v1/request.py",
        "Request",
        ("request_id", "num_prompt_tokens", "num_computed_tokens", "num_preemptions", "status", "_output_token_ids|num_output_tokens"),
    ),
    ("vllm/v1/core/sched/output.py", "SchedulerOutput", ("scheduled_new_reqs",)),
    ("vllm/v1/core/sched/output.py", "NewRequestData", ("req_id", "num_computed_tokens")),
    ("vllm/config/vllm.py", "VllmConfig", ("scheduler_config", "parallel_config")),
]
# Read with a default (a missing one is recorded as unknown, or turns a feature off).
OPTIONAL: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "vllm/v1/metrics/stats.py",
        "SchedulerStats",
        (
            "num_running_reqs",
            "num_waiting_reqs",
            "num_skipped_waiting_reqs",
            "num_kv_fetch_reqs_by_stage",
            "step_counter",
            "kv_cache_usage",
            "prefix_cache_stats",
            "kv_connector_stats",
            "connector_prefix_cache_stats",
            "iteration_details",
            "cudagraph_stats",
        ),
    ),
    ("vllm/v1/metrics/stats.py", "IterationStats", ("num_prompt_tokens", "num_generation_tokens", "num_preempted_reqs", "finished_requests")),
    ("vllm/v1/metrics/stats.py", "PrefixCacheStats", ("queries", "hits")),
    ("vllm/v1/request.py", "Request", ("sampling_params", "arrival_time", "num_cached_tokens")),
    ("vllm/v1/core/sched/output.py", "SchedulerOutput", ("preempted_req_ids", "kv_connector_metadata")),
    ("vllm/sampling_params.py", "SamplingParams", ("max_tokens", "n", "ignore_eos", "stop", "stop_token_ids")),
    (
        "vllm/config/vllm.py",
        "VllmConfig",
        (
            "model_config",
            "cache_config",
            "compilation_config",
            "kv_transfer_config",
            "attention_config",
            "device_config",
            "diffusion_config",
            "use_v2_model_runner",
        ),
    ),
    (
        "vllm/config/parallel.py",
        "ParallelConfig",
        ("data_parallel_index|data_parallel_rank", "_api_process_count", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"),
    ),
    ("vllm/config/model.py", "ModelConfig", ("model", "served_model_name", "enforce_eager", "max_model_len", "dtype")),
    ("vllm/config/cache.py", "CacheConfig", ("block_size", "cache_dtype", "enable_prefix_caching")),
    ("vllm/config/compilation.py", "CompilationConfig", ("cudagraph_mode", "mode")),
    ("vllm/config/device.py", "DeviceConfig", ("device_type",)),
    ("vllm/config/kv_transfer.py", "KVTransferConfig", ("kv_connector", "kv_role", "kv_connector_extra_config", "kv_buffer_device")),
    ("vllm/compilation/cuda_graph.py", "CUDAGraphStat", ("num_unpadded_tokens", "num_padded_tokens", "num_paddings", "runtime_mode")),
    ("vllm/v1/core/sched/diffusion_scheduler.py", "DiffusionScheduler", ()),
    ("vllm/v1/core/sched/diffusion_scheduler.py", "DiffusionAsyncScheduler", ()),
    ("vllm/v1/hisparse/types.py", "SparseKVRowMirror", ("num_rows",)),
]
# Source text that must be there: the plugin's entry-point group, the version attribute.
TEXT: list[tuple[str, str]] = [
    ("vllm/plugins/__init__.py", '"vllm.stat_logger_plugins"'),
    ("vllm/v1/metrics/loggers.py", "issubclass(\n            plugin_class, StatLoggerBase"),
    ("vllm/version.py", "__version__"),
]
# Our overrides: (our file, our class, vLLM's file, vLLM's class, the methods ours override).
OVERRIDES = [
    (
        "collector/vllm/plugin.py",
        "FlightRecorderStatLogger",
        "vllm/v1/metrics/loggers.py",
        "StatLoggerBase",
        ("__init__", "record", "log_engine_initialized", "log"),
    ),
    (
        "collector/vllm/scheduler.py",
        "RecordingScheduler",
        "vllm/v1/core/sched/scheduler.py",
        "Scheduler",
        ("__init__", "add_request", "_free_request", "schedule", "update_from_output", "make_stats"),
    ),
]


class Source:
    """One release's Python files, parsed on demand."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self._trees: dict[str, ast.Module] = {}

    def tree(self, path: str) -> ast.Module | None:
        if path not in self.files:
            return None
        if path not in self._trees:
            self._trees[path] = ast.parse(self.files[path])
        return self._trees[path]

    def find_class(self, path: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` as seen from module ``path``: defined there, or imported into it."""
        tree = self.tree(path)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return path, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                real = next(a.name for a in node.names if (a.asname or a.name) == name)
                for target in _module_files(path, node):
                    found = self.find_class(target, real, depth + 1)
                    if found is not None:
                        return found
        return None

    def members(self, path: str, name: str, depth: int = 0) -> set[str] | None:
        """Every name an instance of the class has by its source: fields, class attributes,
        methods, properties, ``self.x`` assignments; those of its bases too."""
        found = self.find_class(path, name)
        if found is None:
            return None
        where, cls = found
        out: set[str] = set()
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, ast.Assign):
                out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            target = None
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        out.add(t.attr)
            elif isinstance(node, ast.AnnAssign):
                target = node.target
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    out.add(target.attr)
        if depth < 8:
            for base in cls.bases:
                base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
                if base_name:
                    inherited = self.members(where, base_name, depth + 1)
                    if inherited:
                        out |= inherited
        return out

    def method(self, path: str, cls_name: str, name: str) -> ast.FunctionDef | None:
        found = self.find_class(path, cls_name)
        if found is None:
            return None
        where, cls = found
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        for base in cls.bases:
            if isinstance(base, ast.Name):
                got = self.method(where, base.id, name)
                if got is not None:
                    return got
        return None


def _module_files(path: str, node: ast.ImportFrom) -> list[str]:
    if node.level:
        pkg = path.split("/")[: -node.level]
        mod = pkg + (node.module.split(".") if node.module else [])
    else:
        mod = (node.module or "").split(".")
    base = "/".join(mod)
    return [f"{base}.py", f"{base}/__init__.py"]


def _abstract(fn: ast.FunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "abstractmethod") or (isinstance(d, ast.Attribute) and d.attr == "abstractmethod")
        for d in fn.decorator_list
    )


def accepts(ours: ast.FunctionDef, theirs: ast.FunctionDef) -> list[str]:
    """Why a call made the way ``theirs`` is declared would not fit ``ours`` (empty: it fits)."""
    problems = []
    a, b = ours.args, theirs.args
    our_pos = [x.arg for x in a.posonlyargs + a.args]
    their_pos = [x.arg for x in b.posonlyargs + b.args]
    our_names = set(our_pos) | {x.arg for x in a.kwonlyargs}
    if len(their_pos) > len(our_pos) and a.vararg is None:
        problems.append(f"takes {len(our_pos)} positional, vLLM's {len(their_pos)}")
    for name in their_pos[1:] + [x.arg for x in b.kwonlyargs]:
        if name not in our_names and a.kwarg is None and not (name in their_pos and a.vararg is not None):
            problems.append(f"has no parameter {name!r}")
    our_required = our_pos[: len(our_pos) - len(a.defaults)]
    their_names = set(their_pos) | {x.arg for x in b.kwonlyargs}
    for name in our_required[1:]:
        if name not in their_names:
            problems.append(f"requires {name!r}, which vLLM does not pass")
    return problems


@dataclass
class Report:
    version: str
    missing: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # optional, not found
    notes: list[str] = field(default_factory=list)


def check(version: str, src: Source, ours: Source) -> Report:
    rep = Report(version)
    for table, into in ((REQUIRED, rep.missing), (OPTIONAL, rep.absent)):
        for path, cls, names in table:
            members = src.members(path, cls)
            if members is None:
                into.append(f"`{cls}` ({path})")
                continue
            for name in names:
                if not any(alt in members for alt in name.split("|")):
                    into.append(f"`{cls}.{name}` ({path})")
    for path, text in TEXT:
        body = src.files.get(path, b"").decode()
        if text not in body:
            rep.missing.append(f"{text!r} in {path}")
    for our_path, our_cls, their_path, their_cls, overridden in OVERRIDES:
        found = ours.find_class(our_path, our_cls)
        assert found is not None, f"{our_cls} not in {our_path}"
        ours_methods = {n.name: n for n in found[1].body if isinstance(n, ast.FunctionDef)}
        assert set(overridden) <= set(ours_methods), f"{our_cls} lost one of {overridden}"
        base = src.find_class(their_path, their_cls)
        if base is None:
            continue  # reported above
        for node in base[1].body:
            if isinstance(node, ast.FunctionDef) and _abstract(node) and node.name not in ours_methods:
                rep.missing.append(f"`{our_cls}` does not implement vLLM's abstract `{their_cls}.{node.name}`")
        for name in overridden:
            theirs = src.method(their_path, their_cls, name)
            if theirs is None:
                rep.missing.append(f"`{our_cls}.{name}` overrides nothing: vLLM's `{their_cls}` has no `{name}`")
                continue
            for problem in accepts(ours_methods[name], theirs):
                rep.missing.append(f"`{our_cls}.{name}` {problem}")
    status = src.find_class("vllm/v1/request.py", "RequestStatus")
    if status is not None:
        names = [t.id for n in status[1].body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
        codec = ours.files["collector/channel/codec.py"].decode()
        unknown = [n for n in names if f'"{n.lower()}"' not in codec]
        if unknown:
            rep.notes.append(f"`RequestStatus` members the wire codes do not name (recorded as unknown): {', '.join(unknown)}")
    return rep


def wheel_source(path: Path) -> Source:
    with zipfile.ZipFile(path) as zf:
        return Source({n: zf.read(n) for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")})


def our_source() -> Source:
    return Source({str(p.relative_to(ROOT)): p.read_bytes() for p in (ROOT / "collector").rglob("*.py")})


def find_wheel(folder: Path, version: str, download: bool) -> Path:
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if not found and download:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"vllm=={version}", "-d", str(folder)], check=True)
        found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no vllm-{version} wheel in {folder}")
    return found[0]


def markdown(reports: list[Report]) -> str:
    lines = ["| vLLM | needed, missing | read defensively, absent |", "|---|---|---|"]
    for r in reports:
        lines.append(f"| {r.version} | {len(r.missing)} | {len(r.absent)} |")
    for r in reports:
        lines += ["", f"### vLLM {r.version}", ""]
        lines += [f"- MISSING (needed): {m}" for m in r.missing] or ["- everything the adapter needs is there"]
        lines += [f"- absent (recorded as unknown or off): {m}" for m in r.absent]
        lines += [f"- note: {m}" for m in r.notes]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="*", type=Path, help="vLLM wheels to read")
    ap.add_argument("--versions", nargs="*", default=[], help="vLLM releases, found in --dir or downloaded there")
    ap.add_argument("--dir", type=Path, default=Path("vllm-wheels"), help="where the wheels are kept")
    ap.add_argument("--no-download", action="store_true")
    args = ap.parse_args()
    wheels = list(args.wheels) + [find_wheel(args.dir, v, not args.no_download) for v in args.versions]
    if not wheels:
        ap.error("give wheels or --versions")
    ours = our_source()
    reports = []
    for wheel in wheels:
        version = wheel.name.split("-")[1]
        reports.append(check(version, wheel_source(wheel), ours))
    print(markdown(reports))
    return 1 if any(r.missing for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
