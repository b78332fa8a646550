"""Internal: ``flightrec rules``: the shipped Prometheus rules with absolute runbook links, for Prometheus
or a PrometheusRule. The base comes from ``--runbook-base`` or the settings'
``alerting.runbook_base`` (the base the sidecar's own alerts link to)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from collector.alerting.rules import RulesError, render, shipped_rules
from collector.cli.common import EXIT_USAGE, CliError, settings_from


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "rules",
        parents=parents,
        help="print the Prometheus rules with absolute runbook links",
        description="The shipped Prometheus rules (rules/flightrec-alerts.yml) with each runbook_url made <base>#<alert>.",
    )
    p.add_argument("--config", metavar="FILE", help="settings file whose alerting.runbook_base is the base")
    p.add_argument("--runbook-base", metavar="URL", help="absolute base of the runbook links (default: alerting.runbook_base)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (owner-only if new)")
    p.set_defaults(func=run_rules)


def run_rules(args: argparse.Namespace) -> int:
    base = args.runbook_base
    if base is None:
        base = settings_from(args).alerting.runbook_base
    if not base:
        raise CliError("no runbook base: pass --runbook-base URL or set alerting.runbook_base", EXIT_USAGE)
    try:
        text = render(shipped_rules().read_text(), base)
    except RulesError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None
    return 0
