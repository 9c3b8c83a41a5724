"""``libpq_dsn``: a connection's fields and its extra become one libpq string, several
servers included (a primary and its standby), and a setting named twice differently is
refused rather than one of them silently winning."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from kafka_ingest.db import libpq_dsn
from kafka_ingest.errors import SettingsError


def _dsn(**kwargs: object) -> dict[str, str]:
    fields = {"source": "conn 'pg'", "host": "db", "port": 5432, "user": "u",
              "password": "p", "dbname": "d", "extra": None}
    fields.update(kwargs)
    return conninfo_to_dict(libpq_dsn(**fields))  # type: ignore[arg-type]


def test_several_servers_with_their_ports_in_the_extra() -> None:
    got = _dsn(host="10.0.0.1,10.0.0.2", port=None,
               extra={"port": "5432,5433", "target_session_attrs": "read-write"})
    assert got == {"host": "10.0.0.1,10.0.0.2", "port": "5432,5433", "user": "u",
                   "password": "p", "dbname": "d", "target_session_attrs": "read-write"}


def test_several_servers_on_one_port() -> None:
    got = _dsn(host="a,b", extra={"target_session_attrs": "primary"})
    assert (got["host"], got["port"], got["target_session_attrs"]) == ("a,b", "5432",
                                                                        "primary")


def test_the_same_value_in_a_field_and_the_extra_is_fine() -> None:
    assert _dsn(extra={"port": "5432"})["port"] == "5432"


def test_a_setting_named_twice_differently_is_refused_naming_the_connection() -> None:
    with pytest.raises(SettingsError, match=r"conn 'pg' sets port twice.*5432.*5433"):
        _dsn(extra={"port": "5433"})


def test_a_password_named_twice_is_refused_without_showing_it() -> None:
    with pytest.raises(SettingsError) as info:
        _dsn(extra={"password": "other-secret"})
    assert "other-secret" not in str(info.value) and "(hidden)" in str(info.value)
