"""The API client's edges, over real HTTP on loopback: what the server says when it refuses, a
watch that reports an error or sends garbage, and the renewal parameters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.sources.kube_api import Gone, KubeApi, KubeApiError
from tests.sources.kubeapi_fake import RecordedApi

POD_LIST = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}


async def watch(api: RecordedApi, **kw: Any) -> list[tuple[str, dict[str, Any]]]:
    client = KubeApi(api.url)
    async with client.client() as http:
        return [ev async for ev in client.watch_pods(http, node="n", label_selector="", resource_version="7", **kw)]


def run(script: list[Any], body: Any = None) -> Any:
    async def main() -> Any:
        api = RecordedApi(lists=[POD_LIST], watches=[script])
        await api.start()
        try:
            return await (body(api) if body else watch(api)), api
        finally:
            await api.stop()

    return asyncio.run(main())


def test_an_error_event_is_an_error_and_410_is_gone() -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "too old resource version: 7 (9)", "code": 410}
    with pytest.raises(Gone, match="too old resource version"):
        run([{"type": "ERROR", "object": status}])
    with pytest.raises(KubeApiError, match="internal error") as err:
        run([{"type": "ERROR", "object": {**status, "message": "internal error", "code": 500}}])
    assert not isinstance(err.value, Gone) and err.value.status == 500
    with pytest.raises(Gone):
        run(["410"])  # answered 410 before the stream began


def test_an_event_without_type_or_object_is_an_error() -> None:
    with pytest.raises(KubeApiError, match="without type or object"):
        run([{"kind": "Pod"}])


def test_the_watch_asks_for_bookmarks_from_a_version_and_ends_when_the_server_does() -> None:
    events, api = run([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}])
    assert events == [("BOOKMARK", {"metadata": {"resourceVersion": "9"}})]
    [req] = api.requests
    assert req.query == {
        "fieldSelector": "spec.nodeName=n",
        "watch": "1",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "300",
        "resourceVersion": "7",
    }
    assert "authorization" not in req.headers  # no token file: no header


def test_a_refused_list_says_the_servers_message(tmp_path: Path) -> None:
    async def body(api: RecordedApi) -> None:
        api.list_status = 403
        client = KubeApi(api.url, token_file=tmp_path / "absent")
        async with client.client() as http:
            with pytest.raises(KubeApiError, match="service-account token"):
                await client.list_pods(http, node="n", label_selector="x")
            (tmp_path / "absent").write_text("t\n")
            with pytest.raises(KubeApiError, match="HTTP 403: pods is forbidden") as err:
                await client.list_pods(http, node="n", label_selector="x", namespace="inference")
            assert err.value.status == 403
        assert api.requests[-1].path == "/api/v1/namespaces/inference/pods"

    run([], body)


def test_nobody_listening_is_an_error() -> None:
    async def main() -> None:
        client = KubeApi("http://127.0.0.1:9")
        async with httpx.AsyncClient(timeout=2) as http:
            with pytest.raises(KubeApiError, match="ConnectError"):
                await client.list_pods(http, node="n", label_selector="")

    asyncio.run(main())


def test_a_watch_whose_connection_goes_quiet_past_the_read_timeout_is_an_error() -> None:
    async def body(api: RecordedApi) -> None:
        client = KubeApi(api.url, read_timeout=0.3)  # a dead peer sends nothing, not even a FIN
        async with client.client() as http:
            with pytest.raises(KubeApiError, match="ReadTimeout"):
                async for _ in client.watch_pods(http, node="n", label_selector="", resource_version="7"):
                    pass

    run(["hang"], body)
