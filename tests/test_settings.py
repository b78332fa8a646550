from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main
from collector.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("FLIGHTREC_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "flightrec.yaml"
    p.write_text(text)
    return p


def test_defaults_are_the_embedded_sqlite_on_loopback() -> None:
    s = load_settings()
    assert s.database == "sqlite:///flightrec.db"
    assert s.host == "127.0.0.1" and s.loopback_only
    assert s.ring_steps == 4096 and s.scrape_interval == 1.0


def test_yaml_keys_of_the_product_contract(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        """
engines:
  - name: decode-0
    url: http://127.0.0.1:8000/
    log: /var/log/vllm/decode.log
scrape_interval: 0.5
database: postgresql://u:p@db/flightrec
alertmanager: [http://127.0.0.1:9093]
ring_steps: 2048
api_token: s3cret
nvml: "off"
kmsg: /var/log/kern.log
""",
    )
    s = load_settings(cfg)
    assert s.engines[0].name == "decode-0" and s.engines[0].url == "http://127.0.0.1:8000"
    assert s.engines[0].log == "/var/log/vllm/decode.log"
    assert s.database == "postgresql+psycopg://u:p@db/flightrec"  # normalised to the psycopg 3 driver
    assert s.alertmanager == ["http://127.0.0.1:9093"]
    assert s.api_token is not None and s.api_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)
    assert (s.nvml, s.kmsg, s.ring_steps, s.scrape_interval) == ("off", "/var/log/kern.log", 2048, 0.5)


def test_environment_overrides_file_and_flags_override_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path, "scrape_interval: 5\nring_steps: 100\nport: 9000\n")
    monkeypatch.setenv("FLIGHTREC_SCRAPE_INTERVAL", "2.5")
    monkeypatch.setenv("FLIGHTREC_PORT", "9100")
    monkeypatch.setenv("FLIGHTREC_ALERTMANAGER", "http://a:9093,http://b:9093")
    s = load_settings(cfg, port=9200)
    assert s.scrape_interval == 2.5  # env beats file
    assert s.ring_steps == 100  # file beats default
    assert s.port == 9200  # flag beats env
    assert s.alertmanager == ["http://a:9093", "http://b:9093"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("scrape_interval: fast\n", "scrape_interval"),
        ("scrape_interval: -1\n", "scrape_interval"),
        ("ring_steps: 3\n", "ring_steps"),
        ("database: mysql://x\n", "database"),
        ("nvml: maybe\n", "nvml"),
        ("engines:\n  - name: d\n    url: ftp://x\n", "engines.0.url"),
        ("engines:\n  - url: http://x\n", "engines.0.name"),
        ("scrape_intervall: 1\n", "scrape_intervall"),
        ("alertmanager: [127.0.0.1:9093]\n", "alertmanager"),
        # a step's second half would come after the writer's 2 s hold: stored without it
        ("recorder_read_s: 2.0\n", "recorder_read_s"),
    ],
)
def test_invalid_settings_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(write(tmp_path, text))
    assert str(err.value).startswith(f"{key}:") or f"\n{key}:" in str(err.value)


def test_invalid_env_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLIGHTREC_RING_STEPS", "lots")
    with pytest.raises(SettingsError, match="^ring_steps:"):
        load_settings()


@pytest.mark.parametrize("text", ["engines: [\n", "- just\n- a list\n"])
def test_bad_yaml_is_one_clear_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(SettingsError, match="--config"):
        load_settings(write(tmp_path, text))


def test_cli_exits_2_with_the_key_on_bad_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["serve", "--config", str(write(tmp_path, "scrape_interval: never\n"))])
    assert rc == 2
    err = capsys.readouterr().err
    assert "scrape_interval" in err and "Traceback" not in err


def test_cli_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_non_loopback_bind_without_token_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "api_token" in capsys.readouterr().err


def test_every_key_the_source_docs_name_is_a_setting(tmp_path: Path) -> None:
    """The keys docs/gpu-sources.md and docs/engine-log.md show load (extra keys are refused)."""
    s = load_settings(
        write(
            tmp_path,
            """
nvml: auto
kmsg: auto
gpu_poll_interval: 1.0
pcie_interval: 30.0
gpu_lost_retry: 30.0
xid_events: true
event_timeout_ms: 1000
kmsg_from_start: false
kmsg_poll_interval: 0.05
log_from_start: false
log_poll_interval: 0.05
log_idle_flush: 0.2
log_keep: important
""",
        )
    )
    assert (s.pcie_interval, s.event_timeout_ms, s.log_keep) == (30.0, 1000, "important")


def test_the_configuration_reference_example_loads(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    block = doc.split("```yaml", 1)[1].split("```", 1)[0]
    s = load_settings(write(tmp_path, block.replace("api_token: ...", "api_token: t0ken")))
    assert s.engines[0].name == "decode-0" and s.engines[0].gpus == [1] and s.ring_steps == 4096
    assert s.retention.snapshots_days is None and s.detectors.enter_after == 2


@pytest.mark.parametrize("token", ["", "   ", "\t"])
def test_empty_or_blank_api_token_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], token: str) -> None:
    monkeypatch.setenv("FLIGHTREC_API_TOKEN", token)
    with pytest.raises(SettingsError, match="^api_token: .*empty or blank"):
        load_settings()
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "api_token" in line] == [
        "api_token: Value error, is empty or blank: set a real token, or leave api_token unset"
    ]


def test_blank_token_never_passes_the_bind_check() -> None:
    from pydantic import SecretStr

    from collector.cli.serve import check_bind as _check_bind

    s = load_settings().model_copy(update={"host": "0.0.0.0", "api_token": SecretStr("  ")})
    with pytest.raises(SettingsError, match="api_token"):
        _check_bind(s)


@pytest.mark.parametrize(
    ("text", "nvml", "kmsg"),
    [
        ("nvml: off\nkmsg: off\n", "off", "off"),
        ("nvml: on\nkmsg: on\n", "on", "on"),
        ("nvml: auto\nkmsg: /var/log/kern.log\n", "auto", "/var/log/kern.log"),
    ],
)
def test_bare_yaml_on_and_off_reach_each_sources_settings(tmp_path: Path, text: str, nvml: str, kmsg: str) -> None:
    """YAML 1.1 reads a bare on/off as a boolean; each source's own settings (mounted flat in
    Settings) turn it back, the two sources' validators both applying."""
    p = tmp_path / "flightrec.yaml"
    p.write_text(text)
    s = load_settings(p)
    assert (s.nvml, s.kmsg) == (nvml, kmsg)


def test_each_sources_settings_are_the_settings_defaults() -> None:
    from collector.sources.engine_log_settings import EngineLogSettings
    from collector.sources.kmsg_settings import KmsgSettings
    from collector.sources.nvml_settings import NvmlSettings

    s = Settings()
    for part in (KmsgSettings, NvmlSettings, EngineLogSettings):
        assert set(part.model_fields) <= set(Settings.model_fields)
        assert {k: getattr(s, k) for k in part.model_fields} == part().model_dump()
