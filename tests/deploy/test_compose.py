"""The compose stack, checked without a Docker engine: every file it mounts exists, the pieces
name each other consistently (services, ports, paths, engine names), and the real promtool and
amtool accept the Prometheus and Alertmanager configurations."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def services() -> dict[str, Any]:
    return compose()["services"]


def binds(service: str) -> dict[str, Path]:
    """Container path -> repository path of a service's bind mounts (short syntax, ./ sources)."""
    out = {}
    for vol in services()[service].get("volumes", []):
        src, dst, *_ = vol.split(":")
        if src.startswith("./"):
            out[dst] = ROOT / src
    return out


def host_path(service: str, container_path: str) -> Path:
    """Where a path inside a service's container comes from in the repository."""
    for dst, src in sorted(binds(service).items(), key=lambda kv: -len(kv[0])):
        if container_path == dst or container_path.startswith(dst.rstrip("/") + "/"):
            return src / Path(container_path).relative_to(dst) if container_path != dst else src
    raise AssertionError(f"{container_path} is not mounted into {service}")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def prometheus_config() -> dict[str, Any]:
    return load_yaml(DEPLOY / "prometheus" / "prometheus.yml")


def sidecar_config() -> dict[str, Any]:
    return load_yaml(DEPLOY / "flightrec.yaml")


# -- the compose file ------------------------------------------------------------------------
def test_the_stack_has_its_pieces() -> None:
    svc = services()
    for name in ("flightrec", "postgres", "alertmanager", "prometheus", "grafana"):
        assert name in svc and "profiles" not in svc[name], name
    assert svc["flightrec"]["image"] == svc["flightrec-migrate"]["image"]
    assert svc["flightrec-migrate"]["build"] == "."


def test_every_mounted_file_exists() -> None:
    mounted = [(name, dst, src) for name in services() for dst, src in binds(name).items()]
    assert len(mounted) >= 8
    for name, dst, src in mounted:
        assert src.exists(), f"{name}: {src} (mounted at {dst}) does not exist"


def test_every_dependency_and_volume_is_declared() -> None:
    doc = compose()
    named = set(doc["volumes"])
    for name, svc in doc["services"].items():
        for dep in svc.get("depends_on", []):
            assert dep in doc["services"], (name, dep)
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if not src.startswith(("./", "/", "$", "~")):
                assert src in named, (name, src)
        for secret in svc.get("secrets", []):
            assert secret in doc["secrets"], (name, secret)


def test_ports_are_published_on_loopback_only() -> None:
    for name, svc in services().items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_sidecar_config_path_is_the_one_the_image_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (.+)$", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    assert '"--config", "/etc/flightrec/flightrec.yaml"' in cmd
    assert host_path("flightrec", "/etc/flightrec/flightrec.yaml") == DEPLOY / "flightrec.yaml"


def test_recorder_folder_is_shared_with_the_engines() -> None:
    svc = services()
    recorder_dir = sidecar_config()["recorder_dir"]
    sharing = [n for n in ("flightrec", "vllm-prefill", "vllm-decode") if f"recorder:{recorder_dir}" in svc[n]["volumes"]]
    assert sharing == ["flightrec", "vllm-prefill", "vllm-decode"]
    assert svc["flightrec"]["environment"]["FLIGHTREC_RECORDER_DIR"] == recorder_dir
    for engine in ("vllm-prefill", "vllm-decode"):
        assert svc[engine]["environment"]["FLIGHTREC_RECORDER_DIR"] == recorder_dir
    assert compose()["volumes"]["recorder"]["driver_opts"]["type"] == "tmpfs"


def test_engine_containers_carry_the_sidecars_engine_names() -> None:
    names = {e["name"] for e in sidecar_config()["engines"]}
    svc = services()
    assert {svc[n]["environment"]["FLIGHTREC_ENGINE_NAME"] for n in ("vllm-prefill", "vllm-decode")} == names
    assert "collector.vllm.RecordingScheduler" in svc["vllm-decode"]["command"]


# -- the sidecar's settings ------------------------------------------------------------------
def test_sidecar_settings_load_and_need_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.settings import load_settings

    raw = sidecar_config()
    assert "api_token" not in raw  # from FLIGHTREC_API_TOKEN only
    assert "FLIGHTREC_API_TOKEN" in services()["flightrec"]["environment"]
    monkeypatch.setenv("FLIGHTREC_API_TOKEN", "t0ken")
    settings = load_settings(DEPLOY / "flightrec.yaml")
    assert not settings.loopback_only and settings.api_token is not None
    assert settings.api_token.get_secret_value() == "t0ken"
    assert settings.database.startswith("postgresql+psycopg://")


def test_sidecar_reaches_the_stacks_services() -> None:
    raw = sidecar_config()
    svc = services()
    db = urlsplit(raw["database"])
    assert db.hostname == "postgres" and db.path.lstrip("/") == svc["postgres"]["environment"]["POSTGRES_DB"]
    assert db.username == svc["postgres"]["environment"]["POSTGRES_USER"]
    for url in raw["alertmanager"]:
        assert urlsplit(url).hostname in svc and urlsplit(url).port == 9093
    for engine in raw["engines"]:
        assert urlsplit(engine["url"]).hostname in svc, engine


# -- Prometheus ------------------------------------------------------------------------------
def test_prometheus_scrapes_the_sidecar_and_every_engine() -> None:
    cfg = prometheus_config()
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    port = sidecar_config()["port"]
    sidecar_targets = {t for sc in jobs["flightrec"]["static_configs"] for t in sc["targets"]}
    assert f"flightrec:{port}" in sidecar_targets
    assert all(t.split(":")[0] in services() for t in sidecar_targets)
    # the sidecar wants its token for reads beyond loopback: Prometheus gets it as a secret
    creds = jobs["flightrec"]["authorization"]["credentials_file"]
    assert creds == "/run/secrets/flightrec_api_token" and "flightrec_api_token" in services()["prometheus"]["secrets"]
    # every engine the sidecar watches is scraped, labelled with the sidecar's name for it
    engines = {urlsplit(e["url"]).netloc: e["name"] for e in sidecar_config()["engines"]}
    scraped = {t: sc["labels"]["flightrec_engine"] for sc in jobs["vllm"]["static_configs"] for t in sc["targets"]}
    assert scraped == engines


def test_prometheus_loads_the_shipped_rules_and_alerts_the_stacks_alertmanager() -> None:
    cfg = prometheus_config()
    for rule_file in cfg["rule_files"]:
        assert host_path("prometheus", rule_file) == ROOT / "rules" / "flightrec-alerts.yml"
    am = [t for a in cfg["alerting"]["alertmanagers"] for sc in a["static_configs"] for t in sc["targets"]]
    assert am == ["alertmanager:9093"]


@pytest.mark.promtool
@pytest.mark.skipif(PROMTOOL is None, reason="no promtool binary")
def test_promtool_check_config(tmp_path: Path) -> None:
    # the container paths, rewritten to where the files are here
    cfg = prometheus_config()
    cfg["rule_files"] = [str(host_path("prometheus", f)) for f in cfg["rule_files"]]
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    for job in cfg["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    result = subprocess.run([str(PROMTOOL), "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "SUCCESS: 1 rule files found" in out or "SUCCESS: 1 rule file found" in out


# -- Alertmanager ----------------------------------------------------------------------------
@pytest.mark.alertmanager
@pytest.mark.skipif(AMTOOL is None, reason="no amtool binary")
def test_amtool_check_config() -> None:
    path = host_path("alertmanager", "/etc/alertmanager/alertmanager.yml")
    result = subprocess.run([str(AMTOOL), "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alertmanager_groups_by_labels_the_rules_set() -> None:
    cfg = load_yaml(DEPLOY / "alertmanager" / "alertmanager.yml")
    rules = load_yaml(ROOT / "rules" / "flightrec-alerts.yml")
    from collector.alerting.alerts import DETECTOR_ALERTS

    alertnames = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    # and what only the sidecar sends (it sees a GPU fall off the bus; no series says so)
    alertnames |= set(DETECTOR_ALERTS.values()) | {"GpuLost", "VllmNcclError"}
    # the wedge's page, sent by the sidecar's wedge detector and by the rule over
    # flightrec_engine_stuck_seconds: the inhibitions name it ahead of both
    alertnames |= {"VllmEngineWedged"}
    for inhibit in cfg["inhibit_rules"]:
        for matcher in inhibit["source_matchers"] + inhibit["target_matchers"]:
            name, op, value = re.fullmatch(r'(\w+)(=~|=)"(.*)"', matcher).groups()  # type: ignore[union-attr]
            if name == "alertname":
                named = value.split("|") if op == "=~" else [value]
                assert set(named) <= alertnames, named


# -- Grafana ---------------------------------------------------------------------------------
def test_grafana_loads_the_dashboard_folder() -> None:
    prov = host_path("grafana", "/etc/grafana/provisioning")
    assert prov == DEPLOY / "grafana" / "provisioning"
    providers = load_yaml(prov / "dashboards" / "dashboards.yml")["providers"]
    [provider] = providers
    assert host_path("grafana", provider["options"]["path"]) == ROOT / "dashboards"
    assert (ROOT / "dashboards" / "flightrec.json").is_file()


def test_grafana_datasources_point_at_the_stack() -> None:
    import json

    ds = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yml")["datasources"]
    by_type = {d["type"]: d for d in ds}
    assert urlsplit(by_type["prometheus"]["url"]).hostname == "prometheus"
    pg = by_type["grafana-postgresql-datasource"]
    assert pg["url"] == "postgres:5432"
    assert pg["jsonData"]["database"] == services()["postgres"]["environment"]["POSTGRES_DB"]
    assert pg["secureJsonData"]["password"] == "${GRAFANA_PG_PASSWORD}"
    assert "GRAFANA_PG_PASSWORD" in services()["grafana"]["environment"]
    # the read-only role Grafana logs in with is the one the init script creates
    init = (DEPLOY / "postgres" / "init" / "10-grafana-reader.sh").read_text()
    assert f"CREATE ROLE {pg['user']} LOGIN" in init
    assert host_path("postgres", "/docker-entrypoint-initdb.d") == DEPLOY / "postgres" / "init"
    # the dashboard's datasource variables accept these plugin types
    dash = json.loads((ROOT / "dashboards" / "flightrec.json").read_text())
    wanted = {v["query"] for v in dash["templating"]["list"] if v["type"] == "datasource"}
    assert wanted == set(by_type)


# -- the image and the pages proxy -----------------------------------------------------------
def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1] not in ("root", "0")
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), src
    # the migrations' home is copied in with the package; setup.py ships it inside the package
    assert re.search(r"^COPY alembic \./alembic$", text, re.M) and re.search(r"^COPY .*\bsetup\.py\b", text, re.M)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_pages_proxy_is_read_only_and_adds_the_token() -> None:
    conf = (DEPLOY / "nginx" / "templates" / "flightrec.conf.template").read_text()
    assert re.search(r"limit_except GET \{\s*deny all;\s*\}", conf)
    assert 'proxy_set_header Authorization "Bearer ${FLIGHTREC_API_TOKEN}";' in conf
    env = services()["flightrec-pages"]["environment"]
    assert "FLIGHTREC_API_TOKEN" in env and env["FLIGHTREC_UPSTREAM"].endswith("flightrec:8787}")
    assert sidecar_config()["public_url"] == "http://localhost:8787"
    assert "127.0.0.1:8787:8787" in services()["flightrec-pages"]["ports"]


# -- what issue reports asked of the compose file ---------------------------------------------
def test_compose_says_it_needs_v2_and_the_sidecar_needs_no_grafana_password() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "Compose v2" in text
    # a missing ${VAR:?} fails the whole file, whichever service is started
    assert not re.search(r"\$\{GRAFANA_[A-Z_]*:\?", text)
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    assert required == {"FLIGHTREC_API_TOKEN"}


def test_the_spool_is_a_volume_at_a_configurable_path() -> None:
    side = services()["flightrec"]
    spool_env = side["environment"]["FLIGHTREC_SPOOL_DIR"]
    assert spool_env == "${FLIGHTREC_SPOOL_DIR:-/var/lib/flightrec/spool}"
    # the volume sits on a folder the image made and gave the sidecar's uid (a named volume
    # copies its owner; a path the image lacks would be root's, and the spool unwritable),
    # and the default spool folder is inside it
    assert "spool:/var/lib/flightrec" in side["volumes"]
    assert "spool" in load_yaml(ROOT / "docker-compose.yml")["volumes"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "mkdir -p /var/lib/flightrec/spool" in dockerfile and "chown -R flightrec:flightrec /var/lib/flightrec" in dockerfile
    assert spool_env.split(":-", 1)[1].rstrip("}").startswith("/var/lib/flightrec/")


def test_the_image_health_check_reads_the_settings_not_a_fixed_port() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    [check] = [ln for ln in dockerfile.splitlines() if ln.strip().startswith('CMD ["flightrec", "health"')]
    assert "8787" not in check and "/etc/flightrec/flightrec.yaml" in check
