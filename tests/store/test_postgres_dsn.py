"""Naming a PostgreSQL database without its password, whatever the password holds: the
one redaction every message goes through, and the URLs refused before libpq reads them."""

from __future__ import annotations

import pytest

from flowscope.errors import StoreError, mask_url_credentials, redact_message
from flowscope.store import PostgresEventStore
from flowscope.store.postgres import redact, server
from flowscope.store.postgres.dsn import unencoded_credentials

#: Passwords with the characters a URL parser ends a part at; libpq takes "#", "?" and ":"
#: in a password as they are, so such a URL connects, and nothing may print a piece of it.
DELIMITED = ["se#cretpw", "se?cretpw", "se:cretpw", "se#c?r:etpw"]


@pytest.mark.parametrize("password", DELIMITED)
def test_a_password_is_masked_whole_whatever_characters_it_holds(password: str):
    url = f"postgresql://bob:{password}@127.0.0.1:5432/orders?sslmode=require"
    assert redact(url) == "postgresql://bob:***@127.0.0.1:5432/orders?sslmode=require"
    assert server(url) == "127.0.0.1:5432/orders"
    assert not unencoded_credentials(url)


@pytest.mark.parametrize("password", ["se/cretpw", "s3cret@pw"])
def test_an_unencoded_at_or_slash_in_a_password_is_masked_and_refused_before_libpq(password: str):
    url = f"postgresql://bob:{password}@127.0.0.1:1/orders"
    assert redact(url) == "postgresql://bob:***@127.0.0.1:1/orders"
    assert unencoded_credentials(url)
    assert "cret" not in server(url) and "pw" not in server(url)  # no guess at the host
    with pytest.raises(StoreError) as info:  # libpq would take a piece for the host or port
        PostgresEventStore(url, timeout=1)
    assert "cret" not in str(info.value) and "%40" in str(info.value) and "%2F" in str(info.value)


def test_a_port_that_is_not_a_number_is_a_store_error_naming_it():
    with pytest.raises(StoreError, match="port .* is not a number: 'abc'") as info:
        PostgresEventStore("postgresql://bob:hunter2@127.0.0.1:abc/orders", timeout=1)
    assert "hunter2" not in str(info.value)


def test_a_url_libpq_cannot_parse_is_a_store_error_without_the_password():
    with pytest.raises(StoreError, match="libpq cannot parse it") as info:
        PostgresEventStore("postgresql://bob:hunter2@[::1/orders", timeout=1)
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in server("postgresql://bob:hunter2@[::1/orders")


@pytest.mark.parametrize(
    "url, masked",
    [
        ("postgresql+psycopg://bob:s3cret@h/db", "postgresql+psycopg://bob:***@h/db"),
        ("mysql://bob:s3c#ret@h/db", "mysql://bob:***@h/db"),
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("http://bob:s3c/ret@127.0.0.1:4318", "http://bob:***@127.0.0.1:4318"),
        (
            "postgresql://bob@h/db?sslpassword=s3cret&sslmode=require",
            "postgresql://bob@h/db?sslpassword=***&sslmode=require",
        ),
        ("postgresql://bob@h/db?password=s3cret", "postgresql://bob@h/db?password=***"),
        ("http://127.0.0.1:4318/v1/traces?api_key=s3cret", "http://127.0.0.1:4318/v1/traces?api_key=***"),
    ],
)
def test_any_urls_password_is_masked(url: str, masked: str):
    assert redact(url) == masked and mask_url_credentials(url) == masked
    assert "s3c" not in redact_message(f"cannot connect to {url}: refused")


def test_what_has_no_password_is_left_as_it_is():
    for text in (
        "postgresql://bob@h/d",
        "http://localhost:4318/v1/traces",
        "w@1/check@1",
        "a plain sentence",
    ):
        assert mask_url_credentials(text) == text
    assert redact("host=h password='a b' dbname=d") == "host=h password=*** dbname=d"
    assert (
        redact("postgresql://h/d?password=x2&sslmode=require")
        == "postgresql://h/d?password=***&sslmode=require"
    )
