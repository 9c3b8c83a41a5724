"""The registry client's TLS set-up: none for a registry reached over plain http only (the
CA bundle costs 20-40 ms of CPU per client), verification untouched wherever TLS may be
spoken. No service is touched: building a client connects to nothing."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                    "all_proxy")


@pytest.fixture
def trust_stores_loaded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each verifying TLS context a client builds (the CA bundle loaded), recorded; no
    proxy in the environment unless a test sets one."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    made: list[dict[str, Any]] = []
    real = ssl.create_default_context

    def recording(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", recording)
    return made


def _verify(config: dict[str, Any]) -> ssl.SSLContext:
    registry = SchemaRegistry(RegistrySettings(config))
    try:
        return registry._client._rest_client.verify
    finally:
        registry.close()


def test_a_plain_http_registry_loads_no_trust_store(
        trust_stores_loaded: list[dict[str, Any]]) -> None:
    _verify({"url": "http://127.0.0.1:18081/apis/ccompat/v7,http://replica:8081"})
    assert trust_stores_loaded == []


@pytest.mark.parametrize(("config", "proxy"), [
    # one URL of several speaks TLS
    ({"url": "http://a:8081,https://b:8443"}, None),
    # the user's own TLS setting: the client reads it as it always did
    ({"url": "http://a:8081", "ssl.certificate.location": "/nonexistent.pem"}, None),
    # a proxy may be reached over TLS
    ({"url": "http://a:8081", "proxy": "https://proxy:3128"}, None),
    ({"url": "http://a:8081"}, "https://proxy:3128"),
])
def test_wherever_tls_may_be_spoken_the_client_verifies_as_before(
        trust_stores_loaded: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        config: dict[str, Any], proxy: str | None) -> None:
    if proxy is not None:
        monkeypatch.setenv("HTTP_PROXY", proxy)
    try:
        verify = _verify(config)
    except (OSError, ValueError):  # the client cert's file is not there: it was read
        assert "ssl.certificate.location" in config
        return
    assert len(trust_stores_loaded) == 1
    assert verify.verify_mode is ssl.CERT_REQUIRED and verify.check_hostname
