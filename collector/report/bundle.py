"""The archive to attach to an upstream issue: ``flightrec-report-ID.tar.gz`` holding the
Markdown report, the scrubbed snapshot export (``snapshot.json``, which ``flightrec replay
--from-file`` reads) and a manifest saying what was taken out.

At most ``MAX_BUNDLE_BYTES`` (10 MB, what an issue tracker takes) for a 4,096-step x 256-request
snapshot: the request columns are lists of small numbers and repeated ids, which gzip packs
well (5.0 MB for 4,096 x 256 rows; tests/report/test_bundle.py checks the bound). A bundle over the limit is
refused with its size, never cut silently.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from typing import Any

from collector.errors import InputError
from collector.report.scrub import Scrubber

MAX_BUNDLE_BYTES = 10 * 1000 * 1000


class BundleTooLarge(InputError):
    """The scrubbed snapshot does not fit the attachment limit."""


def build_bundle(export: dict[str, Any], *, keep_hostnames: bool = False, report: Any = None, max_bytes: int = MAX_BUNDLE_BYTES) -> bytes:
    """The tar.gz bytes. ``report(scrubbed_export) -> str`` writes the Markdown from the scrubbed
    export, so the report inside says only what the bundle may."""
    scrub = Scrubber(keep_hostnames=keep_hostnames)
    clean = scrub.export(export)
    root = f"flightrec-report-{clean.get('id') or 'snapshot'}"
    files = {
        "snapshot.json": json.dumps(clean, separators=(",", ":"), default=str).encode(),
        "MANIFEST.txt": _manifest(clean, scrub, keep_hostnames).encode(),
    }
    if report is not None:
        files["report.md"] = str(report(clean)).encode()  # written from the scrubbed export only
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:  # 9 saves 3% at 2.5x the time
        for name, data in files.items():
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mtime, info.mode = len(data), int(now), 0o600
            tar.addfile(info, io.BytesIO(data))
    body = buf.getvalue()
    if len(body) > max_bytes:
        raise BundleTooLarge(f"the bundle is {len(body) / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB an issue takes")
    return body


def _manifest(clean: dict[str, Any], scrub: Scrubber, keep_hostnames: bool) -> str:
    cols = (clean.get("requests") or {}).get("columns") or {}
    return "\n".join(
        [
            f"flightrec report bundle of snapshot {clean.get('id')} ({clean.get('engine')})",
            "",
            "report.md      the bug report (Markdown, in the shape of vLLM's issue template)",
            "snapshot.json  the snapshot export, scrubbed: flightrec replay --plan --from-file snapshot.json",
            "",
            "What was taken out:",
            f"- request ids: {len(scrub.ids)} distinct, each replaced by req- and the first 16 hex digits of its SHA-256",
            "- prompt content: never recorded (lengths only); any field that could hold it is dropped",
            "- secrets (tokens, keys, passwords, credentials in URLs, Authorization headers): replaced by ***",
            "- host names: kept" if keep_hostnames else f"- host names: {len(scrub.hosts)} replaced by host-N",
            "",
            f"Rows: {len(clean.get('steps') or [])} steps, {len(cols.get('step') or [])} request rows, "
            f"{len(clean.get('events') or [])} events, {len(clean.get('log_lines') or [])} log lines.",
            "",
        ]
    )
