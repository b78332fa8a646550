"""The little of the Kubernetes API that discovery needs: list the pods of one node and watch
them from a ``resourceVersion``, over plain HTTP with the pod's service-account token.

httpx rather than the official ``kubernetes`` client: two GET requests (a list and a streamed
watch) are all that is needed, httpx is already the sidecar's HTTP client, and the official
client would add a large generated package (and its urllib3 and websocket stack) to the image
for them. What the official client's watch gives is done here: ``allowWatchBookmarks``, a
``timeoutSeconds`` renewal from the last ``resourceVersion``, and a relist on ``410 Gone``.

The token is read from its file before each request: the kubelet rotates bound service-account
tokens (an hour by default) and rewrites the file.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from collector.sources.base import SourceError

ClientFactory = Callable[[], httpx.AsyncClient]


class KubeApiError(SourceError):
    """The API server refused or failed a request (``status`` when it answered)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Gone(KubeApiError):
    """``410 Gone``: the resourceVersion is too old; list again."""


class KubeApi:
    def __init__(
        self,
        base_url: str,
        *,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        client_factory: ClientFactory | None = None,
        timeout: float = 10.0,
        read_timeout: float | None = 330.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout = timeout
        # a watch is quiet between events, but never longer than its timeoutSeconds (the server
        # then ends it) or the bookmarks' interval: past this, the connection is taken for dead
        self.read_timeout = read_timeout
        self._client_factory = client_factory or self._default_client

    def _default_client(self) -> httpx.AsyncClient:
        verify: ssl.SSLContext | bool = True
        if self.ca_file is not None and self.base_url.startswith("https://"):
            verify = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.AsyncClient(verify=verify, timeout=httpx.Timeout(self.timeout, read=self.read_timeout))

    def client(self) -> httpx.AsyncClient:
        return self._client_factory()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as exc:
                raise KubeApiError(f"cannot read the service-account token {self.token_file}: {exc}") from exc
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return headers

    def _pods_path(self, namespace: str) -> str:
        return f"{self.base_url}/api/v1/namespaces/{namespace}/pods" if namespace else f"{self.base_url}/api/v1/pods"

    @staticmethod
    def _selectors(node: str, label_selector: str) -> dict[str, str]:
        params = {"fieldSelector": f"spec.nodeName={node}"}
        if label_selector:
            params["labelSelector"] = label_selector
        return params

    async def list_pods(self, client: httpx.AsyncClient, *, node: str, label_selector: str, namespace: str = "") -> tuple[list[Any], str]:
        """The node's pods and the list's resourceVersion (to watch from)."""
        try:
            resp = await client.get(self._pods_path(namespace), params=self._selectors(node, label_selector), headers=self._headers())
        except httpx.HTTPError as exc:
            raise KubeApiError(f"list pods: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise KubeApiError(f"list pods: HTTP {resp.status_code}: {_reason(resp.text)}", resp.status_code)
        try:
            body = resp.json()
        except ValueError as exc:
            raise KubeApiError(f"list pods: not JSON: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise KubeApiError("list pods: no items in the answer")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        return body["items"], str(rv or "")

    async def watch_pods(
        self,
        client: httpx.AsyncClient,
        *,
        node: str,
        label_selector: str,
        resource_version: str,
        namespace: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) of each watch event until the server ends the watch: ``ADDED``,
        ``MODIFIED``, ``DELETED``, ``BOOKMARK`` (the object carries only the new
        resourceVersion). An ``ERROR`` event with code 410 raises ``Gone``, another
        ``KubeApiError``."""
        params = {
            **self._selectors(node, label_selector),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        try:
            async with client.stream("GET", self._pods_path(namespace), params=params, headers=self._headers()) as resp:
                if resp.status_code == 410:
                    raise Gone("watch: 410 Gone", 410)
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    raise KubeApiError(f"watch pods: HTTP {resp.status_code}: {_reason(text)}", resp.status_code)
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError as exc:
                        raise KubeApiError(f"watch pods: an event is not JSON: {exc}") from exc
                    kind, obj = (event.get("type"), event.get("object")) if isinstance(event, dict) else (None, None)
                    if not isinstance(kind, str) or not isinstance(obj, dict):
                        raise KubeApiError("watch pods: an event without type or object")
                    if kind == "ERROR":
                        code = obj.get("code")
                        if code == 410:
                            raise Gone(f"watch: {obj.get('message', '410 Gone')}", 410)
                        raise KubeApiError(f"watch pods: {obj.get('message', obj)}", code if isinstance(code, int) else None)
                    yield kind, obj
        except httpx.HTTPError as exc:
            raise KubeApiError(f"watch pods: {type(exc).__name__}: {exc}") from exc


def _reason(text: str) -> str:
    """A Status object's message, else the start of the body."""
    try:
        body = json.loads(text)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return str(body["message"])
    except ValueError:
        pass
    return text[:200]
