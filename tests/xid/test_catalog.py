"""The packaged Xid catalog: every code the triage needs, and a default for the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.model import Severity
from collector.xid.catalog import CATEGORIES, XidCatalog, XidCatalogError, default_catalog, lookup

REQUIRED = [13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154]


@pytest.mark.parametrize("code", REQUIRED)
def test_required_codes_are_known(code: int) -> None:
    info = lookup(code)
    assert info.known and info.code == code
    assert info.name and info.meaning and info.action
    assert info.category in CATEGORIES


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_faults_do_not_ask_for_a_reset(code: int) -> None:
    info = lookup(code)
    assert info.category == "application"
    assert info.severity is not Severity.CRITICAL
    assert "restart the application" in info.action


@pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 119, 120])
def test_reset_or_reboot_class_is_critical(code: int) -> None:
    info = lookup(code)
    assert info.severity is Severity.CRITICAL
    assert "reset the GPU" in info.action or "reboot the node" in info.action


def test_unknown_code_gets_default_entry() -> None:
    info = lookup(99999)
    assert not info.known and info.code == 99999
    assert info.severity is Severity.WARNING


def test_catalog_json_entries_all_load() -> None:
    raw = json.loads(Path("collector/xid/catalog.json").read_text())
    assert default_catalog().codes() == sorted(int(c) for c in raw["codes"])


def test_bad_catalog_raises_own_error(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text(
        json.dumps(
            {
                "default": {"name": "x", "meaning": "x", "severity": "warning", "category": "driver", "action": "x"},
                "codes": {"1": {"name": "x", "meaning": "x", "severity": "fatal", "category": "driver", "action": "x"}},
            }
        )
    )
    with pytest.raises(XidCatalogError):
        XidCatalog.load(bad)
    bad.write_text("{not json")
    with pytest.raises(XidCatalogError):
        XidCatalog.load(bad)


def test_to_dict_is_plain() -> None:
    d = lookup(31).to_dict()
    assert d["severity"] == "warning" and d["code"] == 31
