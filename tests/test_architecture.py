"""The folders are the pipeline's stages and data flows one way through them (README,
"Architecture"): a stage imports only what lies below it, the stages it hands data to (the
committer calls storage) or reads (detectors read ingest's view), never one that would call
back up into it. Read from the source with ``ast``, every import, lazy ones in functions too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "collector"

# A stage may import the stages of a lower rank (and itself). Shared ground first: types, errors,
# redaction, pure /proc reads; then the format both sides of the ring share and the pure
# parsers; the engine side; the sources; ingest; the stores and consumers in the order they call
# each other; the settings that mount each stage's own; the wiring and the interfaces last.
RANK = {
    "errors": 0,
    "model": 0,
    "redact": 0,
    "procfs": 0,
    "cgroup": 0,  # which pod a process runs in, from its cgroup's text (pure; the recorder reads it too)
    "malloc": 0,
    "ticks": 0,  # the loop's shared periodic sleeps: asyncio only
    "heap": 0,
    "durable": 0,
    "columns": 0,  # steps as numpy columns: the form ingest's window keeps and hands storage (imports only the model)
    "__init__": 0,
    "channel": 1,
    "parsers": 1,
    "xid": 1,
    "recorder": 2,  # engine side: writes the channel
    "vllm": 3,  # vLLM's adapters over the recorder
    "tasks": 3,  # the supervisor every long-running stage runs under
    "components": 3,  # named steps started in order, stopped in reverse (the wiring declares its own)
    "sources": 4,
    "stacks": 4,  # reads the node's processes (/proc, py-spy) for a wedge's snapshot, like a source
    "ingest": 5,
    "storage": 6,
    "fleet": 6,  # the fleet's placement, coarse series, outbox, signature and reads: beside storage
    "detectors": 7,  # read ingest's view, emit anomaly events
    "snapshot": 8,  # reads ingest's view, commits through storage
    "alerting": 9,  # consumes events, detector states and commits
    "settings": 10,  # mounts each stage's own settings
    "context": 11,
    "replay": 11,
    "sim": 11,
    "api": 12,
    "report": 12,  # a snapshot export as a bug report: reads the replay plan, the Xid catalog
    "web": 12,
    "service": 13,  # wires the stages once
    "cli": 14,
}
# Imports against the ranks, each with why it is not a call back up the pipeline.
ALLOWED = {
    # the stored form of a snapshot is the document's format (snapshot/document.py, pure):
    # storage packs and unpacks it; the committer is what calls storage
    ("storage", "snapshot.document"),
    # a stage reads its own settings class, which sits next to it and is mounted in Settings
    ("detectors", "settings"),
    ("alerting", "settings"),
    ("snapshot", "settings"),
}


def _stage(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("").parts
    return rel[0]


def _imports(path: Path) -> set[tuple[str, str]]:
    """(stage, module within collector) of each import."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "collector" and len(parts) > 1:
                out.add((parts[1], ".".join(parts[1:])))
    return out


def test_every_stage_has_a_rank() -> None:
    stages = {_stage(p) for p in ROOT.rglob("*.py")}
    assert stages <= set(RANK), sorted(stages - set(RANK))


def test_no_module_imports_a_later_stage() -> None:
    against = []
    for path in sorted(ROOT.rglob("*.py")):
        src = _stage(path)
        for dst, module in _imports(path):
            if dst != src and RANK.get(dst, 0) > RANK[src] and (src, dst) not in ALLOWED and (src, module) not in ALLOWED:
                against.append(f"{path.relative_to(ROOT.parent)} imports collector.{module}")
    assert not against, "\n".join(against)


# The stages after ingest read it through its typed read-only view; only the wiring (and the
# context, which hands a manual snapshot to ingest's front door) names its parts.
INGEST_READERS = {"detectors", "snapshot", "alerting", "api", "web", "replay", "sim"}


def test_later_stages_read_ingest_only_through_its_view() -> None:
    against = []
    for path in sorted(ROOT.rglob("*.py")):
        if _stage(path) not in INGEST_READERS:
            continue
        for dst, module in _imports(path):
            if dst == "ingest" and module != "ingest.view":
                against.append(f"{path.relative_to(ROOT.parent)} imports collector.{module}")
    assert not against, "\n".join(against)


# What the code that runs inside vLLM (the recorder and its vLLM adapter) may import of ours: the
# shared ground and the channel it writes. Anything else would load the sidecar into every
# engine process (tests/vllm/test_import_isolation.py checks the same at run time).
ENGINE_SIDE = {"recorder", "vllm"}
ENGINE_SIDE_MAY_IMPORT = {"errors", "model", "redact", "cgroup", "channel", "recorder", "vllm"}


def test_engine_side_imports_only_the_shared_ground() -> None:
    against = []
    for path in sorted(ROOT.rglob("*.py")):
        if _stage(path) not in ENGINE_SIDE:
            continue
        for dst, module in _imports(path):
            if dst not in ENGINE_SIDE_MAY_IMPORT:
                against.append(f"{path.relative_to(ROOT.parent)} imports collector.{module}")
    assert not against, "\n".join(against)


# -- the view reads and never writes ------------------------------------------------------------


def _state(obj: object, seen: set[int] | None = None) -> object:
    """Everything ``obj`` holds, as plain values, followed through objects, containers and
    arrays (a NaN written as text: it equals nothing, not even itself)."""
    import array  # noqa: PLC0415
    import collections  # noqa: PLC0415
    import dataclasses  # noqa: PLC0415
    import enum  # noqa: PLC0415
    import math  # noqa: PLC0415

    seen = set() if seen is None else seen
    if isinstance(obj, float):
        return repr(obj) if math.isnan(obj) else obj
    if obj is None or isinstance(obj, (str, int, bytes, enum.Enum)):
        return obj
    if id(obj) in seen:
        return ("seen", type(obj).__name__)
    seen.add(id(obj))
    if isinstance(obj, array.array):
        return (obj.typecode, [_state(v, seen) for v in obj])
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):  # an array (the workload log's columns)
        items = obj.tolist()  # (a list of its own: not through ``seen``, whose ids a freed list's may reuse)
        return (str(getattr(obj, "dtype", "")), [_state(v, seen) for v in items] if isinstance(items, list) else _state(items, seen))
    if isinstance(obj, dict):
        return [(_state(k, seen), _state(v, seen)) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, collections.deque, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return (type(obj).__name__, [_state(v, seen) for v in items])
    if callable(obj) and not hasattr(obj, "__dict__") and not hasattr(obj, "__slots__"):
        return ("callable", repr(obj))
    fields: dict[str, object] = {}
    if dataclasses.is_dataclass(obj):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    elif hasattr(obj, "__dict__"):
        fields = dict(vars(obj))
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                fields[name] = getattr(obj, name)
    return (type(obj).__name__, [(k, _state(v, seen)) for k, v in sorted(fields.items()) if not callable(v) or hasattr(v, "__dict__")])


def test_every_query_of_the_view_leaves_ingests_state_as_it_was() -> None:
    """``IngestView`` is what every later stage is given: a query that wrote (the workload's
    export once recorded the engine's death) would make what a reader sees depend on who read
    first. Each of its members is called on a filled ingest, and ingest's whole state compared."""
    from collector.ingest.hub import hub_for  # noqa: PLC0415
    from collector.ingest.view import IngestView  # noqa: PLC0415
    from collector.model import (  # noqa: PLC0415
        HALF_STATS,
        Event,
        EventKind,
        GpuSample,
        LogLine,
        MetricsScrape,
        Severity,
        StepRecord,
        WorkloadArrival,
        WorkloadBatch,
        WorkloadEnd,
    )
    from collector.settings import EngineConfig, Settings  # noqa: PLC0415

    hub = hub_for(Settings(engines=[EngineConfig(name="decode-0", url="http://d", gpus=[0])], ring_steps=16), clock=lambda: 1000.0)
    hub.emit(GpuSample(gpu="GPU-a", index=0, ts=990.0, bus_id="0000:00:05.0"))
    for step in range(20):
        hub.emit(StepRecord(engine="decode-0", ts=980.0 + step * 0.5, step=step, running=4, waiting=1, kv_cache_usage=0.1, halves=HALF_STATS))
    hub.emit(MetricsScrape(engine="decode-0", ts=995.0, values={"num_requests_running": 4.0}))
    hub.emit(LogLine(engine="decode-0", ts=996.0, line="INFO hello"))
    hub.emit(
        WorkloadBatch(
            engine="decode-0",
            ts=991.0,
            records=[
                WorkloadArrival("a", 990.0, 10, 5, 1, True, False),
                WorkloadArrival("b", 990.5, 10, 5, 1, None, None),
                WorkloadEnd("a", 991.0, 5, "length", 0),
            ],
        )
    )
    xid = Event(kind=EventKind.XID, ts=997.0, source="kmsg", message="Xid 43", xid=43, gpu="0000:00:05.0", severity=Severity.WARNING)
    hub.emit(xid)
    view: IngestView = hub.view
    queries = {
        "host": (),
        "dropped": (),
        "now": ((), {}),
        "engine_names": ((), {}),
        "engine": (("decode-0",), {}),
        "route": ((xid,), {}),
        "progress": (("decode-0",), {}),
        "engine_state": (("decode-0",), {}),
        "accepted_since": (("decode-0", 900.0), {}),
        "run_info": (("decode-0",), {}),
        "previous_steps": (("decode-0",), {}),
        "steps": (("decode-0",), {}),
        "recent_steps": (("decode-0", 4), {}),
        "step_seconds": (("decode-0",), {}),
        "last_step": (("decode-0",), {}),
        "last_known": (("decode-0", "kv_cache_usage"), {}),
        "has_step": (("decode-0", 3), {}),
        "steps_held": (("decode-0",), {}),
        "scrapes": (("decode-0",), {"since": 0.0}),
        "last_scrape": (("decode-0",), {}),
        "log_lines": (("decode-0",), {}),
        "events": (("decode-0",), {"since": 0.0}),
        "workload": (("decode-0", 999.0), {"crashed": True}),
        "gpus": ((), {}),
        "gpu_series": ((), {}),
        "gpu_samples": ((), {"since": 0.0, "gpus": {0}}),
        "gpu_key": (("0000:00:05.0",), {}),
        "xid_counts": ((), {}),
    }
    members = {name for name in vars(IngestView) if not name.startswith("_")}
    assert members == set(queries), f"every member of the view is called here: add {sorted(members - set(queries))}"
    before = _state(hub.intake)
    for name, call in queries.items():
        member = getattr(view, name)
        if call:
            args, kwargs = call
            member(*args, **kwargs)
        if name in VIEW_WRITES:
            before = _state(hub.intake)
            continue
        assert _state(hub.intake) == before, f"IngestView.{name} changed ingest's state"
    assert set(VIEW_WRITES) <= set(queries)


# The queries that still write, each with what it writes. To be moved into ingest's filing.
VIEW_WRITES = {
    # the engine's verdict is dated from the first time it is asked, and a fault or wedge mark
    # is cleared when read after the engine stepped again or went down (ingest/state.py)
    "engine_state": "EngineMarks._last, ._fault, ._wedge",
}


# -- records are frozen -------------------------------------------------------------------------

# The records of collector.model that are still changed after they are made, each with where.
# Every other one is frozen: what a source made is what ingest holds, stores and serves.
STILL_MUTABLE = {
    # never changed once made (the step window builds new records from its columns when asked;
    # tests/ingest/test_window_model.py), but not frozen: a frozen dataclass's __init__ is 6x
    # slower, and a snapshot builds up to 4,096 per engine on the fault path
    "StepRecord",
    # given its uid when routed; a later witness's sources merged into it (collector.xid.merge)
    "Event",
    # a source's own health, kept and updated by that source (served as it is, never stored)
    "SourceStatus",
}


def test_the_records_that_flow_are_frozen_and_slotted() -> None:
    import dataclasses  # noqa: PLC0415

    from collector import model  # noqa: PLC0415

    records = {
        name: cls for name, cls in vars(model).items() if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == model.__name__
    }
    assert STILL_MUTABLE <= set(records)
    for name, cls in records.items():
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        assert hasattr(cls, "__slots__"), f"{name} has no slots"
        if name not in STILL_MUTABLE:
            assert params.frozen, f"{name} is not frozen"


# -- the public surface (docs/public-surface.md) ------------------------------------------------------
DOCS = ROOT.parent / "docs"
INTERNAL = "Internal:"
# Modules of other stages that do not say yet whether they are public: each is marked (``__all__``
# or an ``Internal:`` docstring) by the next change to its stage, which removes it from here.
NOT_MARKED_YET: set[str] = set()
NO_ALL_YET: set[str] = set()


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _public_modules() -> set[str]:
    """The modules the public surface's table names."""
    table = [line for line in (DOCS / "public-surface.md").read_text().splitlines() if line.startswith("|")]
    import re

    return {m for line in table for m in re.findall(r"`(collector(?:\.\w+)*)`", line)}


def _docstring_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _defined(tree: ast.Module) -> set[str]:
    """Top-level names of a module, and those its module ``__getattr__`` answers (lazy imports)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            if node.name == "__getattr__":
                out |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def _all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = ast.literal_eval(node.value)
            return list(value)
    return None


def _path_of(module: str) -> Path:
    base = ROOT.parent.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_every_public_module_has_all_and_everything_in_it_exists() -> None:
    public = _public_modules()
    assert {"collector.cli", "collector.settings", "collector.recorder", "collector.channel"} <= public
    against = []
    for module in sorted(public):
        path = _path_of(module)
        assert path.exists(), f"docs/public-surface.md names {module}, which does not exist"
        tree = ast.parse(path.read_text())
        names = _all(tree)
        if names is None:
            if module not in NO_ALL_YET:
                against.append(f"{module}: no __all__")
            continue
        missing = sorted(set(names) - _defined(tree))
        if missing:
            against.append(f"{module}: __all__ names {missing}, which it does not define")
        if _docstring_line(path).startswith(INTERNAL):
            against.append(f"{module}: public, but its docstring says {INTERNAL}")
    assert not against, "\n".join(against)


def test_every_other_module_says_it_is_internal() -> None:
    public = _public_modules()
    against = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        if module == "collector" or module in public or path.stem.startswith("_") and path.stem != "__init__":
            continue  # the root package exports only ``__version__``; ``_name``: internal by its name
        parts = module.split(".")
        packages = [".".join(parts[:i]) for i in range(2, len(parts) + 1)]  # itself, and each package above it
        if any(p in NOT_MARKED_YET for p in packages):
            continue
        marked = [p for p in packages if _path_of(p).exists() and _docstring_line(_path_of(p)).startswith(INTERNAL)]
        if not marked:
            against.append(f"{module}: neither public (docs/public-surface.md) nor marked {INTERNAL!r}")
    assert not against, "\n".join(against)


def test_doc_examples_import_only_the_public_surface() -> None:
    """What the README and docs/ show a user importing is public, and in its module's ``__all__``."""
    import re

    public = _public_modules()
    against = []
    for doc in [ROOT.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        for module, names in re.findall(r"^\s*from (collector(?:\.\w+)*) import ([\w, ]+)", doc.read_text(), re.M):
            if module not in public:
                against.append(f"{doc.name}: imports {module}, which is internal")
                continue
            exported = _all(ast.parse(_path_of(module).read_text())) or []
            against += [f"{doc.name}: imports {n} from {module}, not in its __all__" for n in names.replace(" ", "").split(",") if n not in exported]
    assert not against, "\n".join(against)


# -- an open snapshot's life (collector/snapshot/lifecycle.py) ----------------------------------------
# Fields only an open snapshot has: nothing outside its module assigns them (they change through its
# transitions; ``OpenSnapshot.__setattr__`` refuses it at run time too).
OPEN_SNAPSHOT_FIELDS = {"snapshot_id", "amended", "duplicate", "spool_path", "intent_path", "spool_error", "late", "gpus", "retake", "until"}


def test_an_open_snapshot_changes_only_through_its_transitions() -> None:
    against = []
    for path in sorted((ROOT / "snapshot").rglob("*.py")):
        if path.name == "lifecycle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr in OPEN_SNAPSHOT_FIELDS and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    against.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} assigns .{t.attr}")
    assert not against, "\n".join(against)
