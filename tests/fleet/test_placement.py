"""One setting, ``database``, names the node-local and the shared store; either may be absent."""

from __future__ import annotations

import pytest

from collector.fleet.placement import Placement, placement
from collector.settings import SettingsError, load_settings

LOCAL, SHARED = "sqlite:///node.db", "postgresql+psycopg://fr@db/fleet"


@pytest.mark.parametrize(
    ("database", "want"),
    [
        (LOCAL, Placement(local=LOCAL, shared=None)),
        ("postgresql://fr@db/fleet", Placement(local=SHARED, shared=None)),  # one store for everything
        ({"local": LOCAL, "shared": SHARED}, Placement(local=LOCAL, shared=SHARED)),
        ({"shared": "postgresql://fr@db/fleet"}, Placement(local=None, shared=SHARED)),  # steps in the rings only
        ({"local": LOCAL}, Placement(local=LOCAL, shared=None)),
    ],
)
def test_the_forms(database: object, want: Placement) -> None:
    s = load_settings(database=database)
    got = placement(s)
    assert got == want
    assert s.database == got.primary  # what every reader of snapshots uses
    assert got.series == want.local and got.split == (want.shared is not None)


def test_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLIGHTREC_DATABASE", f'{{"local": "{LOCAL}", "shared": "{SHARED}"}}')
    assert placement(load_settings()) == Placement(local=LOCAL, shared=SHARED)


@pytest.mark.parametrize(
    ("database", "says"),
    [
        ({}, "needs local, shared or both"),
        ({"local": None, "shared": None}, "needs local, shared or both"),
        ({"remote": SHARED}, "unknown key"),
        ({"local": 5}, "database.local"),
        ({"local": "mysql://x"}, "database"),
        ("{not json", "JSON"),
    ],
)
def test_bad_forms_name_the_problem(database: object, says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        load_settings(database=database)
