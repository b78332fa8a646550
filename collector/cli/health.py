"""Internal: ``flightrec health``: exit 0 if the sidecar this configuration describes answers /healthz;
``flightrec health --engine NAME``: exit 0 if that engine is healthy by the sidecar's verdict.

For container health checks: it reads the same settings as ``serve`` (file, FLIGHTREC_*
variables), so the check follows the configured host and port instead of a port baked into
the image. /healthz needs no token and answers 200 while the process works (a degraded
source too), so only a sidecar that stopped serving fails it.

With ``--engine`` it asks ``GET /api/v1/engines/NAME/health`` (no token either): exit 0 while the
engine is ok, idle, asleep, paused or starting, 1 while it is wedged, down or its GPU faulted (the
state, since when and why on one line), 2 for an engine the sidecar does not know.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

from collector.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CliError, settings_from


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "health",
        parents=parents,
        help="exit 0 if the configured sidecar answers /healthz (--engine: if that engine is healthy)",
        description="Ask the sidecar these settings describe for /healthz (container health checks); with --engine, "
        "for that engine's verdict: exit 1 when it is wedged, down or its GPU faulted.",
    )
    p.add_argument("--engine", metavar="NAME", help="the engine's verdict instead: exit 1 when it is wedged, down or its GPU faulted")
    p.add_argument("--config", metavar="FILE", help="the YAML settings file serve was started with")
    p.add_argument("--port", type=int, help="override the settings' port")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer")
    p.set_defaults(func=run_health)


def probe_host(host: str) -> str:
    """Where to reach a sidecar bound to ``host`` from the same machine."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def run_health(args: argparse.Namespace) -> int:
    settings = settings_from(args, port=args.port)
    base = f"http://{probe_host(settings.host)}:{settings.port}"
    if args.engine:
        return engine_health(base, args.engine, timeout=args.timeout)
    url = f"{base}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310 - our own URL
            body = json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CliError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    print(f"{url}: {body.get('status', 'ok')}")
    return 0


def engine_health(base: str, engine: str, *, timeout: float) -> int:
    """The engine's verdict: 0 healthy, 1 wedged/down/GPU fault (said on one line)."""
    url = f"{base}/api/v1/engines/{urllib.parse.quote(engine, safe='/')}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - our own URL
            status, body = response.status, _json(response.read())
    except urllib.error.HTTPError as exc:
        status, body = exc.code, _json(exc.read())
        if status == 404:
            raise CliError(f"{url}: the sidecar watches no engine named {engine!r}", EXIT_USAGE) from exc
        if status != 503:
            raise CliError(f"{url}: HTTP {status}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    state = str(body.get("state") or "unknown")
    since = body.get("since")
    when = f" since {datetime.fromtimestamp(since, tz=UTC).isoformat(timespec='seconds')}" if isinstance(since, (int, float)) else ""
    reason = f": {body['reason']}" if body.get("reason") else ""
    print(f"engine {engine}: {state}{when}{reason}")
    return EXIT_OK if status == 200 else EXIT_FAILURE


def _json(raw: bytes) -> dict[str, Any]:
    try:
        out = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}
