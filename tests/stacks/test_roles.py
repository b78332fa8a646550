"""Process roles from vLLM's process titles (vllm/utils/system_utils.py set_process_title)."""

from __future__ import annotations

import pytest

from collector.stacks import roles


@pytest.mark.parametrize(
    ("cmdline", "name", "server", "role"),
    [
        (["VLLM::EngineCore"], "VLLM::EngineCor", False, roles.ENGINE_CORE),
        (["VLLM::EngineCore_DP1"], "VLLM::EngineCor", False, roles.ENGINE_CORE),
        (["VLLM::Worker_TP0"], "VLLM::Worker_TP", False, roles.WORKER),
        (["VLLM::Worker_PP1_TP3"], "VLLM::Worker_PP", False, roles.WORKER),
        (["VLLM::Worker"], "VLLM::Worker", False, roles.WORKER),
        (["MYORG::Worker_DP0_TP1_EP1"], "MYORG::Worker_D", False, roles.WORKER),  # VLLM_PROCESS_NAME_PREFIX
        (["VLLM::APIServer_0"], "VLLM::APIServer", False, roles.API_SERVER),
        (["VLLM::DPCoordinator"], "VLLM::DPCoordin", False, roles.DP_COORDINATOR),
        (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"], "python3", True, roles.API_SERVER),
        (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "Qwen/Qwen2.5-0.5B"], "vllm", False, roles.API_SERVER),
        (["/usr/bin/python3", "-c", "from multiprocessing.resource_tracker import main;main(5)"], "python3", False, roles.HELPER),
        (["/usr/bin/python3", "/x/torch/_inductor/compile_worker/__main__.py"], "python3", False, roles.HELPER),
        (["/bin/sh", "-c", "sleep 1"], "sh", False, roles.OTHER),
        (["/usr/bin/python3", "engine.py"], "VLLM::EngineCor", False, roles.ENGINE_CORE),  # the title in comm only
        (["/usr/bin/python3", "worker.py"], "VLLM::Worker_TP", False, roles.WORKER),
    ],
)
def test_role_of(cmdline: list[str], name: str, server: bool, role: str) -> None:
    assert roles.role_of(cmdline, name, is_server=server)[0] == role


def test_the_step_roles_are_read() -> None:
    assert roles.STEP_ROLES <= roles.DUMPED and roles.HELPER not in roles.DUMPED
