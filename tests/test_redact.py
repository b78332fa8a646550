"""Redaction, table-driven: every secret form the probe found, in text, URLs, dicts and argv."""

from __future__ import annotations

import pytest

from collector.redact import MASK, is_secret_name, redact, redact_text

AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HF_LONG = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"

# (text, secrets that must be gone, text that must stay)
TEXT = [
    (f"AWS_ACCESS_KEY_ID={AWS_ID} AWS_SECRET_ACCESS_KEY={AWS_SECRET}", [AWS_ID, AWS_SECRET], ["AWS_SECRET_ACCESS_KEY="]),
    (f"aws_secret_access_key = {AWS_SECRET}", [AWS_SECRET], ["aws_secret_access_key = "]),
    (f"using key {AWS_ID} for s3", [AWS_ID], ["using key", "for s3"]),
    ("redis://u:PW-s3cr3t@cache:6379/0", ["PW-s3cr3t"], ["redis://u:***@cache:6379/0"]),
    ("redis://:PW-s3cr3t@cache:6379", ["PW-s3cr3t"], ["redis://:***@cache"]),
    ("postgresql://flight:p@ss@db.internal/x", ["p@ss"], ["flight:***@db.internal/x"]),
    ("http://host:8000/metrics", [], ["http://host:8000/metrics"]),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", ["eyJhbGciOiJIUzI1NiJ9"], ["Authorization: "]),
    ('{"headers": {"Authorization": "Bearer tok-123"}}', ["tok-123"], ['"headers"']),
    ("kv_transfer_config={'extra': {'auth': {'header': 'bearer abc.def'}}}", ["abc.def"], ["{'auth': {'header': 'bearer ***'}}"]),
    ("Authorization: Basic dXNlcjpwYXNz", ["dXNlcjpwYXNz"], []),
    ("vllm serve m --api-key sk-live-1234 --port 8000", ["sk-live-1234"], ["--api-key ***", "--port 8000"]),
    ("vllm serve m --hf-token=hf_x --max-tokens 16", ["hf_x"], ["--hf-token=***", "--max-tokens 16"]),
    (
        "non-default args: {'model': 'q', 'api_key': ['sk-abcdef123'], 'port': 8000}",
        ["sk-abcdef123"],
        ["'model': 'q'", "'api_key': ['***']", "'port': 8000"],
    ),
    ("EngineArgs(api_key='k-9d8f7', max_num_seqs=8)", ["k-9d8f7"], ["api_key='***'", "max_num_seqs=8"]),
    ("password: hunter2", ["hunter2"], ["password: ***"]),
    ("DB_PASSWORD=hunter2 NCCL_DEBUG=INFO", ["hunter2"], ["NCCL_DEBUG=INFO"]),
    ('{"token": "x"}', ['"x"'], ['{"token": "***"}']),
    ('{"client_secret":"abc","max_tokens":16,"num_tokens":3}', ["abc"], ['"max_tokens":16', '"num_tokens":3']),
    ("HF_TOKEN=hf_short1", ["hf_short1"], ["HF_TOKEN="]),
    ("downloading with hf_abc123 now", ["hf_abc123"], ["downloading with", "now"]),
    (f"token {HF_LONG}", [HF_LONG], []),
    ("hf_overrides={} hf_config_path=None tokenizer=x", [], ["hf_overrides={}", "hf_config_path=None", "tokenizer=x"]),
    ("key sk-proj-AbC123xyz and ghp_abcdefghijklmnopqrstu", ["sk-proj-AbC123xyz", "ghp_abcdefghijklmnopqrstu"], []),
    ("password='unterminated and more", ["unterminated and more"], ["password="]),
    (
        "max_num_batched_tokens=8192 kv_cache_usage=0.03 prompt_tokens=5",
        [],
        ["max_num_batched_tokens=8192", "kv_cache_usage=0.03", "prompt_tokens=5"],
    ),
]


@pytest.mark.parametrize(("text", "gone", "kept"), TEXT, ids=[t[0][:40] for t in TEXT])
def test_redact_text(text: str, gone: list[str], kept: list[str]) -> None:
    out = redact_text(text)
    for secret in gone:
        assert secret not in out, out
    for part in kept:
        assert part in out, out
    if gone:
        assert MASK in out
    assert redact_text(out) == out  # masking twice changes nothing


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("api_key", True),
        ("VLLM_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("aws_session_token", True),
        ("Authorization", True),
        ("db_password", True),
        ("client_secret", True),
        ("token", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("max_tokens", False),
        ("num_tokens", False),
        ("tokenizer", False),
        ("kv_cache_usage", False),
        ("prompt_tokens", False),
        ("token_type", False),
        ("NCCL_NET_PLUGIN", False),
        ("block_size", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_redact_structures() -> None:
    fp = {
        "env": {"HF_TOKEN": "hf_short", "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "NCCL_DEBUG": "INFO", "EMPTY_TOKEN": ""},
        "kv_transfer_config": {"kv_connector_extra_config": {"backend": "redis://u:PW@h:1", "headers": {"authorization": "Bearer t0k"}}},
        "argv": ["vllm", "serve", "m", "--api-key", "sk-123456789", "--port", "8000", "--token", "--x"],
        "args_tuple": ("--hf-token", "hf_abcdefgh1"),
        "non_default_args": "{'api_key': ['sk-zzzzzzzz']}",
        "max_tokens": 16,
        "nested": [{"password": ["a", "b"]}, {"Token": 5}],
    }
    out = redact(fp)
    text = repr(out)
    for secret in ("hf_short", AWS_SECRET, "PW", "t0k", "sk-123456789", "hf_abcdefgh1", "sk-zzzzzzzz", "'a'", "'b'"):
        assert secret not in text, secret
    assert out["env"]["NCCL_DEBUG"] == "INFO" and out["env"]["EMPTY_TOKEN"] == ""
    assert out["argv"] == ["vllm", "serve", "m", "--api-key", MASK, "--port", "8000", "--token", "--x"]
    assert out["args_tuple"] == ("--hf-token", MASK)
    assert out["max_tokens"] == 16
    assert out["nested"] == [{"password": MASK}, {"Token": MASK}]
    assert fp["env"]["HF_TOKEN"] == "hf_short"  # a copy: the input is left as it was


def test_redact_leaves_other_values_alone() -> None:
    assert redact(None) is None and redact(3) == 3 and redact(0.5) == 0.5
    assert redact("plain text") == "plain text"
    assert redact("x", key="HF_TOKEN") == MASK
