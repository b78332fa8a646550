"""Internal: secrets never reach what we store or serve: one place that masks them, for every path.

``redact(value)`` copies a structure (dicts, lists, tuples, strings; anything else as is) with
secrets replaced by ``***``; ``redact_text(text)`` does it for one string. Every stored or served
path calls one of them: snapshots, event rows, the engines table's fingerprint, the API, and log
records.

What is a secret, and in which forms it is caught:

- a dict key that names one (``HF_TOKEN``, ``api_key``, ``AWS_SECRET_ACCESS_KEY``,
  ``Authorization``, ``db_password``, ``client_secret``): its whole value, whatever its type;
- the same name in text, followed by ``=`` or ``:``, bare or quoted, in any case, with its value
  bare, quoted or a list (``api_key='k'``, ``password: x``, ``{"token": "x"}``, vLLM's
  "non-default args" line ``'api_key': ['sk-...']``, ``AWS_SECRET_ACCESS_KEY=...``);
- a command-line flag naming one: ``--api-key x``, ``--hf-token=x``, and in an argv list
  ``["--api-key", "x"]``;
- credentials in a URL, ``scheme://user:password@host`` (the user is kept);
- ``Bearer <token>``, and any ``Authorization: <scheme> <credentials>``;
- values recognisable on their own: AWS access key ids (``AKIA...``), Hugging Face tokens
  (``hf_`` with a digit or capital), OpenAI-style ``sk-...``, GitHub ``ghp_...``.

A name is a secret when its last part is one of the words below (``max_tokens`` or
``num_gpu_blocks_override`` are not). Every pattern can start only where a word starts, so the
cost is linear in the text (``scripts/fuzz.py`` checks it like the parsers').
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# The last part of a name that holds a secret; earlier parts are free (aws_, hf_, db_, vllm_).
_WORDS = (
    r"(?:token|secret|password|passwd|pwd|passphrase|api[_-]?key|apikey|access[_-]?key(?:[_-]id)?"
    r"|secret[_-]?(?:access[_-]?)?key|private[_-]?key|session[_-]?key|credentials?|auth|authorization)"
)
_NAME = r"(?:[A-Za-z0-9]+[_-])*" + _WORDS
_SECRET_NAME = re.compile(_NAME, re.IGNORECASE)
_FLAG = re.compile(r"--?" + _NAME, re.IGNORECASE)

# key = value, key: value; the key bare or quoted ('api_key': ..., "token": ...).
_KEY_VALUE = re.compile(
    r"(?<![\w-])(?P<key>(?P<q>['\"]?)" + _NAME + r"(?P=q)[ \t]*[:=][ \t]*)"
    r"(?P<value>\[[^\]\n]*\]?|'(?:[^'\\\n]|\\.)*'?|\"(?:[^\"\\\n]|\\.)*\"?|[^\s,;{}()\[\]'\"]+)",
    re.IGNORECASE,
)
# --api-key x, --hf-token=x (a value that is itself a flag is left alone)
_FLAG_VALUE = re.compile(r"(?<![\w-])(?P<flag>--?" + _NAME + r")(?P<sep>=|[ \t]+)(?P<value>(?!-)[^\s,;'\"]+)", re.IGNORECASE)
_URL_CREDS = re.compile(r"(?<![\w+.-])(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^/\s]*)@")
_AUTH_HEADER = re.compile(r"(?i)(?<![\w-])(?P<head>authorization[\"']?[ \t]*[:=][ \t]*[\"']?)(?P<scheme>[A-Za-z]+ )?[^\s\"',;}]+")
_BEARER = re.compile(r"(?i)(?<![\w-])(?P<head>bearer[ \t]+)[A-Za-z0-9._~+/=-]+")
_STANDALONE = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS access key id
    r"|hf_(?=[a-z]*[A-Z0-9])[A-Za-z0-9]{6,}(?![A-Za-z0-9])"  # HF token: a digit or capital in it
    r"|sk-[A-Za-z0-9_-]{6,}"  # OpenAI-style
    r"|gh[pousr]_[A-Za-z0-9]{16,}"  # GitHub
    r")"
)


def _mask_value(m: re.Match[str]) -> str:
    value = m.group("value")
    if value.startswith("["):
        masked = f"['{MASK}']" if value.endswith("]") else f"['{MASK}'"
    elif value[:1] in ("'", '"'):
        q = value[0]
        masked = q + MASK + (q if len(value) > 1 and value.endswith(q) else "")
    else:
        masked = MASK
    return m.group("key") + masked


def redact_text(text: str) -> str:
    """``text`` with every secret form of the module docstring masked."""
    if not isinstance(text, str):
        return text
    text = _URL_CREDS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m['head']}{MASK}", text)  # the scheme goes too: "Basic x"
    text = _BEARER.sub(lambda m: f"{m['head']}{MASK}", text)
    text = _FLAG_VALUE.sub(lambda m: f"{m['flag']}{m['sep']}{MASK}", text)
    text = _KEY_VALUE.sub(_mask_value, text)
    return _STANDALONE.sub(MASK, text)


def is_secret_name(name: str) -> bool:
    """Whether a dict key, environment variable or field name holds a secret."""
    return _SECRET_NAME.fullmatch(name) is not None


def redact(value: Any, key: str = "") -> Any:
    """A copy of ``value`` with secrets masked: dicts by key, sequences (argv lists too) and
    strings by pattern. ``key`` is kept for callers that pass the name the value came under."""
    if key and is_secret_name(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: (MASK if is_secret_name(str(k)) and v not in (None, "") else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = _redact_argv(list(value))
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _redact_argv(items: list[Any]) -> list[Any]:
    # ["--api-key", "x"]: the flag and its value are separate items.
    out: list[Any] = []
    secret_next = False
    for item in items:
        if secret_next and isinstance(item, str) and not item.startswith("-"):
            out.append(MASK)
            secret_next = False
            continue
        secret_next = isinstance(item, str) and _FLAG.fullmatch(item) is not None
        out.append(redact(item))
    return out
