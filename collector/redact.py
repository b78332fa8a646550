"""Secrets never reach a snapshot: tokens, keys and passwords in env-like keys, in URLs
(``scheme://user:password@host``) and in ``--api-key X``-style arguments are replaced."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_SECRET_KEY = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH)", re.I)
_URL_CREDS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")
_ARG_SECRET = re.compile(r"(?P<flag>--?[\w-]*(?:token|key|secret|password)[\w-]*[= ])(?P<val>\S+)", re.I)
_ASSIGN = re.compile(r"\b(?P<k>[A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY)[A-Z0-9_]*)=(?P<v>\S+)")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")


def redact_text(text: str) -> str:
    text = _URL_CREDS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _ARG_SECRET.sub(lambda m: f"{m['flag']}{MASK}", text)
    text = _ASSIGN.sub(lambda m: f"{m['k']}={MASK}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return _HF_TOKEN.sub(MASK, text)


def redact(value: Any, key: str = "") -> Any:
    """Return a copy of ``value`` with secrets masked (dicts by key, strings by pattern)."""
    if isinstance(value, dict):
        return {k: (MASK if _is_secret_key(str(k)) and v not in (None, "") else redact(v, str(k)))
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v, key) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def _is_secret_key(key: str) -> bool:
    # "kv_cache_usage" or "max_tokens" are not secrets; names that carry one are.
    if key.lower() in ("max_tokens", "num_tokens", "prompt_tokens", "generation_tokens", "tokens"):
        return False
    return bool(_SECRET_KEY.search(key))
