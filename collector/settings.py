"""The one settings object: defaults < YAML file (``--config``) < ``FLIGHTREC_*`` variables <
command-line flags. Read once in the CLI and passed down; nothing else reads the environment
(the in-engine recorder, which runs inside vLLM, reads only ``FLIGHTREC_RECORDER_DIR`` and
``FLIGHTREC_ENGINE_NAME``, through ``collector.recorder.env``, which imports nothing of ours).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from collector.alerting.config import AlertingSettings
from collector.detectors.config import DetectorThresholds
from collector.errors import FlightrecError
from collector.fleet.placement import unfold as unfold_database
from collector.recorder.env import recorder_dir_from_env
from collector.sources.dcgm_settings import DcgmSettings
from collector.sources.discovery_settings import DiscoverySettings
from collector.sources.engine_log_settings import EngineLogSettings
from collector.sources.kmsg_settings import KmsgSettings
from collector.sources.nvml_settings import NvmlSettings
from collector.stacks.settings import StacksSettings

__all__ = ["EngineConfig", "RetentionConfig", "Settings", "SettingsError", "load_settings"]


class SettingsError(FlightrecError):
    """Invalid settings. ``str()`` is one line per problem, each naming the key."""


class EngineConfig(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/-]+$")
    url: str = Field(description="base URL; /metrics and /health live under it")
    log: str | None = Field(default=None, description="engine log file to follow, or '-' for stdin")
    gpus: list[int] | None = Field(default=None, description="GPU indices this engine uses")
    pair: str | None = Field(default=None, description="P/D pair name, to group prefill and decode")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")


class RetentionConfig(BaseModel):
    model_config = {"extra": "forbid"}

    steps_hours: float = Field(default=24.0, gt=0, description="every step (chunks) and every /metrics scrape")
    step_seconds_hours: float = Field(default=72.0, gt=0, description="the per-second step series (engine_step_seconds)")
    gpu_samples_hours: float = Field(default=24.0, gt=0)
    events_days: float = Field(default=30.0, gt=0)
    coarse_days: float = Field(default=7.0, gt=0, description="the shared store's coarse series (Postgres: whole partitions)")
    snapshots_days: float | None = Field(default=None, description="None keeps snapshots forever")
    interval_s: float = Field(default=300.0, gt=0)


class Settings(KmsgSettings, NvmlSettings, DcgmSettings, EngineLogSettings, BaseSettings):
    """The one settings object. Each source's own settings are defined next to it
    (``collector/sources/*_settings.py``) and mounted here flat, as flightrec.yaml spells them."""

    model_config = SettingsConfigDict(env_prefix="FLIGHTREC_", env_nested_delimiter="__", extra="forbid", validate_default=True)

    engines: list[EngineConfig] = Field(default_factory=list)
    scrape_interval: float = Field(default=1.0, gt=0, le=3600)
    scrape_timeout: float = Field(default=2.0, gt=0)
    health_fail_threshold: int = Field(default=3, ge=1)
    engine_start_grace_s: float = Field(
        default=600.0, ge=0, description="an engine that never answered is starting, not down, this long after the first try"
    )
    # one store, or a mapping {local, shared}: collector/fleet/placement.py says what goes where
    database: str = "sqlite:///flightrec.db"
    database_local: str | None = Field(default=None, description="set by database's mapping form: the node-local store")
    database_split: bool = Field(default=False, description="set by database's mapping form: database is the shared store")
    fleet_series_interval_s: float = Field(default=10.0, ge=1.0, le=3600, description="a coarse series row per engine and GPU this often")
    fleet_partition_hours: float = Field(default=24.0, ge=1.0, le=24 * 31, description="the shared store's time partitions span this")
    alertmanager: Annotated[list[str], NoDecode] = Field(default_factory=list)
    ring_steps: int = Field(default=4096, ge=16, le=1_000_000)
    engine_forget_after_s: float = Field(
        default=900.0,
        ge=0,
        description="an engine discovery saw leave (its pod gone) is forgotten this long after: its rings, series and "
        "per-engine state freed, its row gone from /api/v1/engines (its snapshots and events stay)",
    )
    gpu_ring_seconds: float = Field(default=600.0, gt=0)
    log_ring_lines: int = Field(default=2000, ge=10)
    ring_request_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1 << 16,
        description="per engine: per-request blocks kept (the oldest steps keep only their aggregates past it)",
    )
    # All engines' blocks together. 32 MiB leaves up to 4 engines their 8 MiB each; at 8 engines
    # each keeps 4 MiB (300-440 steps at 256 running, by the ids' length: 3-4 s at 100 steps/s). The blocks read from a
    # ring stay there (collector.channel.blocks: their place, not their bytes), so this bounds
    # the per-request evidence and what a snapshot copies out (4-8 MiB an engine), and the
    # sidecar's memory only for blocks from elsewhere.
    ring_request_bytes_total: int = Field(
        default=32 * 1024 * 1024,
        ge=1 << 16,
        description="all engines: per-request blocks kept; each engine keeps min(ring_request_bytes, this / engines)",
    )
    workload_requests: int = Field(default=10_000, ge=0, description="requests kept per engine for replay")
    workload_seconds: float = Field(default=3600.0, gt=0, description="how far back the workload log reaches")
    recorder_join_wait: float = Field(default=120.0, ge=0, description="hold an unmatched ring this long for its engine's port")
    recorder_read_s: float = Field(
        default=1.0,
        gt=0,
        # A step's two halves come from two rings, read apart: its second half must be in within
        # the writer's 2 s hold (collector.storage.writer), read_s + a 0.1 s poll + a margin, or
        # the stored row lacks it (the request half's mirror_rows and host_blocks). (A ring
        # unread past 3 s also reads as the sidecar behind: collector.context.RING_LATE_S.)
        # 1 s against 0.5: 6.6-6.9% of a core against 7.4-7.8% at node scale (docs/benchmarks-history.md).
        le=1.5,
        description="a ring's records are read this often (sooner once many wait; at once for a snapshot): "
        "longer reads more steps at once for less CPU, and the live series lag by up to this much",
    )
    spool_dir: Path | None = Field(default=None, description="where snapshots wait for the database; default beside SQLite")
    api_token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    public_url: str | None = Field(default=None, description="base URL used in alert links")
    recorder_dir: Path = Field(default_factory=recorder_dir_from_env)
    recorder: Literal["auto", "off"] = "auto"
    write_batch_interval: float = Field(
        default=1.0,
        gt=0,
        description="the continuous series are written this often, one transaction (a step is held 2 s for its "
        "second half anyway; the rings still hold what a killed sidecar had not written)",
    )
    snapshot_gpu_seconds: float = Field(default=300.0, gt=0)
    snapshot_settle_s: float = Field(default=1.0, ge=0, description="wait for late evidence")
    incident_window_s: float = Field(default=30.0, gt=0)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    host_name: str | None = Field(default=None, description="this node's name; default hostname")
    alerting: AlertingSettings = Field(default_factory=AlertingSettings)
    detectors: DetectorThresholds = Field(default_factory=DetectorThresholds)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    stacks: StacksSettings = Field(default_factory=StacksSettings)  # a wedged engine's stacks (collector/stacks)

    @model_validator(mode="before")
    @classmethod
    def _database_mapping(cls, values: Any) -> Any:
        return unfold_database(values)

    @field_validator("database", "database_local")
    @classmethod
    def _db_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(("sqlite", "postgresql")):
            raise ValueError("must be a sqlite:/// or postgresql+psycopg:// URL")
        if v.startswith("postgresql://"):
            v = "postgresql+psycopg://" + v[len("postgresql://") :]
        return v

    @field_validator("api_token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        # An empty token would match an empty "Bearer " header: refuse it rather than serve.
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("is empty or blank: set a real token, or leave api_token unset")
        return v

    @field_validator("alertmanager", mode="before")
    @classmethod
    def _am_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [u.strip() for u in v.split(",") if u.strip()]
        return v

    @field_validator("alertmanager")
    @classmethod
    def _am_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} must start with http:// or https://")
        return [u.rstrip("/") for u in v]

    @property
    def loopback_only(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if _CONFIG_FILE is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=_CONFIG_FILE))
        return tuple(sources)


_CONFIG_FILE: Path | None = None


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        lines.append(f"{key}: {msg}")
    return "\n".join(lines)


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build the settings; raise SettingsError with a message naming each bad key."""
    global _CONFIG_FILE
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise SettingsError(f"--config: no such file: {path}")
        try:
            data = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"--config: {path} is not valid YAML: {exc}") from exc
        if data is not None and not isinstance(data, dict):
            raise SettingsError(f"--config: {path} must hold a mapping of settings")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    _CONFIG_FILE = Path(config_file) if config_file is not None else None
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    finally:
        _CONFIG_FILE = None
