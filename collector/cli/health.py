"""``flightrec health``: exit 0 if the sidecar this configuration describes answers /healthz.

For container health checks: it reads the same settings as ``serve`` (file, FLIGHTREC_*
variables), so the check follows the configured host and port instead of a port baked into
the image. /healthz needs no token and answers 200 while the process works (a degraded
source too), so only a sidecar that stopped serving fails it.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from collector.cli.common import CliError, settings_from


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "health",
        parents=parents,
        help="exit 0 if the configured sidecar answers /healthz",
        description="Ask the sidecar these settings describe for /healthz (container health checks).",
    )
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
    url = f"http://{probe_host(settings.host)}:{settings.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310 - our own URL
            body = json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CliError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    print(f"{url}: {body.get('status', 'ok')}")
    return 0
