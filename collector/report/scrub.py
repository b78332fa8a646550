"""A snapshot export made fit to leave the site: what an upstream bug report may carry.

- **Secrets**: every form ``collector.redact`` knows, in every string and by key, again (a
  snapshot is redacted when stored; an export read from a file, or stored by an older version,
  may not be).
- **Request ids**: replaced by ``req-`` and the first 16 hex digits of their SHA-256, the same
  everywhere in the bundle (columns, the crash dump, log lines, messages), so the rows of one
  request still line up; the site can map its own ids the same way, nobody else can invert them.
- **Prompt content**: the recorder never records it (lengths only); any key that could hold it
  (a crash dump's ``prompt_token_ids``, ``prompt``, ``messages``...) is dropped, and its text
  form (``prompt_token_ids=[...]``) masked in log lines.
- **Hostnames** (unless kept): every host name the snapshot names (its host, the peers', the
  fingerprint's ``hostname``, the host of any URL other than loopback) becomes ``host-N``, in
  every string.

Pure: ``Scrubber(keep_hostnames=...).export(doc)`` returns a new dict; the input is untouched.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from collector.redact import redact, redact_text

# Keys whose value can be prompt or output content; dropped wherever they appear.
CONTENT_KEYS = frozenset(
    {
        "prompt",
        "prompts",
        "prompt_token_ids",
        "prompt_embeds",
        "prompt_text",
        "messages",
        "content",
        "text",
        "output_text",
        "token_ids",
        "output_token_ids",
        "all_token_ids",
        "new_token_ids",
        "mm_inputs",
        "mm_features",
        "multi_modal_data",
        "images",
    }
)
_CONTENT_TEXT = re.compile(
    r"(?P<key>\b(?:" + "|".join(sorted(CONTENT_KEYS, key=len, reverse=True)) + r")['\"]?\s*[=:]\s*)"
    r"(?P<value>\[[^\]]*\]?|'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?)"
)
# vLLM's request ids: the OpenAI server's (cmpl-/chatcmpl-<hex>[-n]), the engine's own.
# (not "req-": that is what a hashed id looks like, and scrubbing twice must change nothing)
_REQUEST_ID = re.compile(r"\b(?:cmpl|chatcmpl|embd|score|classify|pooling|transcribe)-[0-9a-fA-F]{8,}(?:-[0-9a-fA-F]+)*\b")
REQUEST_ID_KEYS = frozenset({"request_id", "req_id", "id"})
# a URL's host (after any user:password@): masked like a known host name, learnt as met
_URL_HOST = re.compile(r"(?P<pre>\b[a-zA-Z][\w+.-]*://(?:[^/@\s]*@)?)(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)")
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", ""})  # noqa: S104 - names, not binds


def hash_request_id(rid: str) -> str:
    return "req-" + hashlib.sha256(rid.encode()).hexdigest()[:16]


class Scrubber:
    def __init__(self, *, keep_hostnames: bool = False) -> None:
        self.keep_hostnames = keep_hostnames
        self.ids: dict[str, str] = {}
        self.hosts: dict[str, str] = {}
        self._id_re: re.Pattern[str] | None = None
        self._host_re: re.Pattern[str] | None = None

    # -- what to replace ---------------------------------------------------------------------
    def learn(self, doc: dict[str, Any]) -> None:
        """Collect the request ids and host names the export holds before any text is rewritten."""
        cols = (doc.get("requests") or {}).get("columns") or {}
        self._learn_ids(cols.get("request_id") or [])
        wl = ((doc.get("workload") or {}).get("requests") or {}).get("columns") or {}
        self._learn_ids(wl.get("id") or [])
        reqs = ((doc.get("summary") or {}).get("requests_at_last_step") or {}).get("mirror_rows") or {}
        self._learn_ids(reqs)
        for e in doc.get("events") or []:
            for r in (e.get("data") or {}).get("requests") or []:
                if isinstance(r, dict):
                    self._learn_ids([r.get("request_id")])
        if not self.keep_hostnames:
            names: list[Any] = [doc.get("host")]
            for fp in [doc.get("fingerprint") or {}] + [p.get("fingerprint") or {} for p in doc.get("peers") or []]:
                names += [fp.get("hostname"), fp.get("server_host")]
            names += [p.get("host") for p in doc.get("peers") or []]
            names += [_url_host(u) for u in _urls(doc)]
            for name in names:
                if isinstance(name, str) and name.strip() and name not in LOOPBACK and name not in self.hosts:
                    self.hosts[name] = f"host-{len(self.hosts) + 1}"
        self._id_re = _alternation(self.ids)
        self._host_re = _alternation(self.hosts, word=True)

    def _learn_ids(self, ids: Iterable[Any]) -> None:
        for rid in ids:
            if isinstance(rid, str) and rid and rid not in self.ids:
                self.ids[rid] = hash_request_id(rid)

    # -- rewriting -----------------------------------------------------------------------------
    def text(self, s: str) -> str:
        s = redact_text(s)
        s = _CONTENT_TEXT.sub(lambda m: m.group("key") + "'***'", s)
        s = _REQUEST_ID.sub(lambda m: hash_request_id(m.group(0)), s)  # the same hash as the known ids get
        if self._id_re is not None:
            s = self._id_re.sub(lambda m: self.ids[m.group(0)], s)
        if not self.keep_hostnames:
            s = _URL_HOST.sub(self._url_host, s)
        if self._host_re is not None:
            s = self._host_re.sub(lambda m: self.hosts.get(m.group(0), m.group(0)), s)
        return s

    def _url_host(self, m: re.Match[str]) -> str:
        host = m.group("host")
        if host in LOOPBACK or host.startswith("127.") or host == "[::1]" or re.fullmatch(r"host-\d+", host):
            return m.group(0)
        if host not in self.hosts:
            self.hosts[host] = f"host-{len(self.hosts) + 1}"
        return m.group("pre") + self.hosts[host]

    def value(self, v: Any, key: str = "") -> Any:
        if isinstance(v, str):
            if key in REQUEST_ID_KEYS and v in self.ids:
                return self.ids[v]
            return self.text(v)
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            for k, x in v.items():
                ks = str(k)
                if ks.lower() in CONTENT_KEYS:
                    continue
                out[self.text(ks) if (ks in self.ids or ks in self.hosts) else ks] = self.value(x, ks)
            return out
        if isinstance(v, (list, tuple)):
            return [self.value(x, key) for x in v]
        return v

    def export(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The whole export, scrubbed (the request columns by lookup, not by pattern: a
        4,096 x 256 snapshot has a million ids)."""
        self.learn(doc)
        # by key first: a secret-named field goes whole (the request columns are numbers, ids
        # and statuses: rewritten below column by column, not walked value by value)
        doc = {**redact({k: v for k, v in doc.items() if k != "requests"}), "requests": doc.get("requests")}
        out: dict[str, Any] = {}
        for k, v in doc.items():
            if k == "requests":
                out[k] = self._requests(v or {})
            elif k == "workload" and isinstance(v, dict):
                out[k] = self._workload(v)
            else:
                out[k] = self.value(v, k)
        return out

    def _requests(self, table: dict[str, Any]) -> dict[str, Any]:
        cols = dict(table.get("columns") or {})
        if "request_id" in cols:
            cols["request_id"] = [self.ids.get(r, r) if isinstance(r, str) else r for r in cols["request_id"]]
        for name in list(cols):
            if name.lower() in CONTENT_KEYS:
                del cols[name]
            elif name not in ("request_id", "step"):
                cols[name] = self._column(cols[name])
        return {**{k: v for k, v in table.items() if k != "columns"}, "columns": cols}

    def _column(self, values: list[Any]) -> list[Any]:
        """Strings rewritten once per distinct value (a status column has a handful)."""
        seen: dict[str, Any] = {}
        out = []
        for x in values:
            if isinstance(x, str):
                y = seen.get(x)
                if y is None:
                    y = seen[x] = self.value(x)
                out.append(y)
            elif isinstance(x, (dict, list)):
                out.append(self.value(x))
            else:
                out.append(x)
        return out

    def _workload(self, wl: dict[str, Any]) -> dict[str, Any]:
        reqs = dict(wl.get("requests") or {})
        cols = dict(reqs.get("columns") or {})
        if "id" in cols:
            cols["id"] = [self.ids.get(r, r) if isinstance(r, str) else r for r in cols["id"]]
        for name in list(cols):
            if name.lower() in CONTENT_KEYS:
                del cols[name]
        reqs["columns"] = cols
        rest = self.value({k: v for k, v in wl.items() if k != "requests"})
        return {**rest, "requests": reqs}


def _alternation(words: dict[str, str], *, word: bool = False) -> re.Pattern[str] | None:
    if not words:
        return None
    body = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(r"(?<![\w.-])(?:" + body + r")(?![\w-])" if word else "(?:" + body + ")")


def _urls(doc: dict[str, Any]) -> list[str]:
    out = []
    for e in doc.get("events") or []:
        url = (e.get("data") or {}).get("url")
        if isinstance(url, str):
            out.append(url)
    configured = (doc.get("summary") or {}).get("configured")
    if isinstance(configured, dict) and isinstance(configured.get("url"), str):
        out.append(configured["url"])
    return out


def _url_host(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None
