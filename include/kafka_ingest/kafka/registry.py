"""The schema registry (Confluent's API, e.g. Apicurio's ``/apis/ccompat/v7``): writer
schemas by id and a subject's versions, through confluent-kafka's ``SchemaRegistryClient``
with bounded time-outs and retries, and its failures mapped onto the error tree.

Every setting the user gives reaches the client (``url``, ``basic.auth.user.info``,
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``,
``ssl.key.password``, ``timeout``, ``max.retries``, ...); an unknown one is a
:class:`SettingsError`, and no credential is ever logged (:meth:`RegistrySettings.__repr__`).

What a failure means: a schema id the registry does not know (404) is the *message's*
fault, a data error decided by the caller; the registry unreachable, timing out, or
answering 5xx/429 is :class:`RegistryUnavailable` (transient: the task fails, Airflow
retries, nothing is dead-lettered); a refused login or a TLS certificate it cannot verify
is :class:`RegistryRefused` (permanent).

A schema may name others by reference (``references``: an Avro named type, a Protobuf
import, each registered under a subject of its own, as confluent-kafka's serializers
register them): every schema this client returns carries the schemas it references,
fetched by subject and version, recursively, each version once per client (versions never
change). A reference the registry has no version for is left without its schema, for the
codec to refuse (:class:`~kafka_ingest.errors.SchemaUnreadable`); the registry down while
references are fetched is :class:`RegistryUnavailable` like any other request.
"""

from __future__ import annotations

import base64
import functools
import ssl
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard
from urllib.parse import urlsplit, urlunsplit
from urllib.request import getproxies

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from kafka_ingest.errors import RegistryRefused, RegistryUnavailable, SettingsError


@functools.cache
def client_api() -> Any:
    """confluent-kafka's registry client module, imported on first use: with authlib, httpx
    and cryptography it is a fifth of a command's start (0.2 s of CPU), which a pipeline
    without a registry, and every ``kafka-ingest`` command that reads none, never pays. A
    process that times its runs calls it first, as it imports the engine first (the
    benchmark's Avro row)."""
    with warnings.catch_warnings():
        # authlib (imported with the client for its OAuth support) asks for httpx2 on
        # import; the client prefers httpx2 where installed and falls back to httpx:
        # nothing to do. authlib installs an "always" filter for its warnings when
        # imported: ours goes after.
        import authlib.deprecate  # noqa: F401

        warnings.filterwarnings("ignore", message="The httpx module is deprecated")
        import confluent_kafka.schema_registry as api
        from confluent_kafka.schema_registry import error

    return types.SimpleNamespace(client=api.SchemaRegistryClient,
                                 error=error.SchemaRegistryError)


def _is_registry_error(exc: BaseException) -> TypeGuard[Any]:
    """The client's own error (an HTTP answer); without the client loaded, none can be."""
    return "confluent_kafka.schema_registry" in sys.modules and \
        isinstance(exc, client_api().error)


#: Bounded by default: httpx waits forever without a time-out, and the client's own
#: retries back off up to 20 s each.
DEFAULTS: dict[str, Any] = {"timeout": 10, "max.retries": 2, "retries.wait.ms": 200,
                            "retries.max.wait.ms": 2000, "cache.latest.ttl.sec": 60}
_SECRETS = ("basic.auth.user.info", "ssl.key.password", "bearer.auth.token",
            "bearer.auth.client.secret")
#: The registry's "not found" codes: subject (40401), version (40402), schema (40403). A
#: 404 without one (a wrong URL path: no such API) is a setting to fix, not a missing schema.
NOT_FOUND = frozenset({40401, 40402, 40403})
#: Answers no retry changes: the request or the setting is wrong.
_PERMANENT_STATUS = frozenset({400, 401, 403, 404, 405, 409, 422})
#: How deep references are followed (a schema referencing one that references ...): far
#: beyond any real schema, and a bound on a registry whose references loop.
MAX_REFERENCE_DEPTH = 32


@dataclass(frozen=True)
class RegistrySettings:
    """The ``SchemaRegistryClient`` config of one registry (``url`` and the rest)."""

    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.config.get("url"):
            raise SettingsError("the schema registry settings need 'url' (e.g. "
                                "http://127.0.0.1:18081/apis/ccompat/v7)")

    def __repr__(self) -> str:
        shown = {k: ("***" if k in _SECRETS else v) for k, v in self.config.items()}
        shown["url"] = self.url
        return f"RegistrySettings({shown})"

    @property
    def url(self) -> str:
        """The URL as logs and errors may show it: without credentials in it (the client
        reads basic auth from ``https://user:password@host`` too)."""
        return ",".join(_without_userinfo(u.strip()) for u in str(self.config["url"]).split(","))


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}{f':{parts.port}' if parts.port else ''}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def registry_settings_from(*, source: str, host: str | None, port: int | None,
                           scheme: str | None, login: str | None, password: str | None,
                           extra: dict[str, Any]) -> RegistrySettings:
    """An Airflow connection's fields as the client's settings: ``<scheme>://host:port``
    plus the extra's ``path`` (``/apis/ccompat/v7``), login and password as basic auth,
    and every other key of the extra passed as it is (``ssl.ca.location``, ``timeout``,
    ...; an unknown one is refused by the client, naming it). ``source`` names the
    connection in errors, never its secrets."""
    if not host:
        raise SettingsError(f"{source}: the schema registry connection has no host")
    config = dict(extra)
    path = str(config.pop("path", "") or "")
    if "://" in host:
        base = host.rstrip("/")
    else:
        base = f"{scheme or 'http'}://{host}{f':{port}' if port else ''}"
    config["url"] = base + (path if not path or path.startswith("/") else "/" + path)
    if login or password:
        if "basic.auth.user.info" in config:
            raise SettingsError(f"{source}: give basic auth as the login and password or as "
                                "the extra's basic.auth.user.info, not both")
        config["basic.auth.user.info"] = f"{login or ''}:{password or ''}"
    return RegistrySettings(config)


def is_descriptor(text: str) -> bool:
    """Whether a Protobuf schema's text is a base64 ``FileDescriptorProto`` (what
    confluent-kafka's serializers register) rather than ``.proto`` source.

    Registries differ: asked for ``format=serialized``, Confluent's turns ``.proto`` text
    into a descriptor, while Apicurio 3.3 tries to parse a stored descriptor as ``.proto``
    and answers 500. So the schema is fetched as stored first, and as ``serialized`` only
    when it is source text."""
    try:
        raw = base64.b64decode(text, validate=True)
        descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (ValueError, DecodeError):
        return False
    return bool(raw)


@dataclass(frozen=True)
class Reference:
    """One of a schema's ``references``: the name the schema knows it by (an Avro named
    type's full name, a Protobuf import's file name) and the subject version registered
    under it. ``schema`` is that version, its own references resolved; None when the
    registry has no such version (or the references loop back on themselves)."""

    name: str
    subject: str
    version: int
    schema: WriterSchema | None = None


@dataclass(frozen=True)
class WriterSchema:
    """A registered schema: its id, type (``AVRO``, ``PROTOBUF``, ``JSON``) and text, and
    the schemas it references (resolved: :class:`Reference`)."""

    schema_id: int
    schema_type: str
    text: str
    subject: str | None = None
    version: int | None = None
    references: tuple[Reference, ...] = ()

    def referenced(self) -> list[Reference]:
        """Every reference, direct or through another schema, each subject version once,
        a schema's own references before it (the order a reader defines them in)."""
        out: list[Reference] = []
        seen: set[tuple[str, int]] = set()

        def visit(references: tuple[Reference, ...]) -> None:
            for ref in references:
                if (ref.subject, ref.version) in seen:
                    continue
                seen.add((ref.subject, ref.version))
                if ref.schema is not None:
                    visit(ref.schema.references)
                out.append(ref)

        visit(self.references)
        return out


def _refused_tls(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return False  # the connection dropped in the handshake: an outage, not a setting
        if isinstance(seen, ssl.SSLError):  # a certificate, a protocol or version mismatch
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def map_registry_error(operation: str, exc: Exception) -> Exception:
    """The error tree's error for a failed registry request (not-found is the caller's)."""
    if _is_registry_error(exc):
        status = exc.http_status_code
        if status in _PERMANENT_STATUS:
            hint = " (no such API at this URL: check its path, e.g. /apis/ccompat/v7)" \
                if status == 404 else ""
            return RegistryRefused(operation, f"HTTP {status}: {exc.error_message}{hint}")
        return RegistryUnavailable(operation, f"HTTP {status}: {exc.error_message}")
    # The client's HTTP library (httpx, or httpx2 where installed): a request that got no
    # answer (refused, reset, timed out, TLS).
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpx2"):
        if _refused_tls(exc):
            return RegistryRefused(operation, f"TLS: {exc}")
        return RegistryUnavailable(operation, f"{type(exc).__name__}: {exc}")
    return exc


def _client_config(config: dict[str, Any]) -> dict[str, Any]:
    """The client's config: :data:`DEFAULTS`, then the user's settings. A registry reached
    over plain ``http://`` only (every URL; no ``ssl.*`` setting; no proxy, set or in the
    environment, that could speak TLS) is given no TLS trust store: the client would
    otherwise build a verifying TLS context, loading the whole CA bundle (20-40 ms of CPU
    per client, a plan and a slice each making one) for connections that never speak TLS
    (the client follows no redirect). An ``https://`` URL keeps the client's verification
    as it is."""
    out = {**DEFAULTS, **config}
    urls = [u.strip().lower() for u in str(out["url"]).split(",")]
    if (all(u.startswith("http://") for u in urls) and "proxy" not in out
            and not getproxies() and not any(k.startswith("ssl.") for k in out)):
        out["ssl.ca.location"] = False  # the client's "no trust store"; http never uses it
    return out


class SchemaRegistry:
    """One client of one registry; writer schemas cached by id (they never change)."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        try:
            self._client = client_api().client(_client_config(settings.config))
        except ValueError as exc:  # an unknown or malformed setting, named by the client
            raise SettingsError(f"schema registry settings: {exc}") from None
        self._by_id: dict[int, WriterSchema | None] = {}
        #: (subject, version, serialized) -> a referenced schema, resolved.
        self._referenced: dict[tuple[str, int, bool], WriterSchema | None] = {}

    def close(self) -> None:
        self._client.close()

    def schema(self, schema_id: int, *, serialized: bool = False) -> WriterSchema | None:
        """The schema registered under ``schema_id``, or None when the registry has none
        (``serialized``: Protobuf as a base64 ``FileDescriptorProto``, see
        :func:`is_descriptor`)."""
        if schema_id in self._by_id:
            return self._by_id[schema_id]
        found = self._resolved(_fetched(lambda fmt: self._schema(schema_id, fmt), serialized),
                               serialized)
        self._by_id[schema_id] = found
        return found

    def _schema(self, schema_id: int, fmt: str | None) -> WriterSchema | None:
        found = self._ask(f"get schema {schema_id}", self._client.get_schema, schema_id, fmt)
        if found is None:
            return None
        return WriterSchema(schema_id, found.schema_type or "AVRO", found.schema_str or "",
                            references=_references(found.references))

    def latest(self, subject: str, *, serialized: bool = False) -> WriterSchema | None:
        """The subject's latest version, or None when there is no such subject."""
        return self._resolved(_fetched(lambda fmt: self._latest(subject, fmt), serialized),
                              serialized)

    def _latest(self, subject: str, fmt: str | None) -> WriterSchema | None:
        found = self._ask(f"latest of {subject}", self._client.get_latest_version, subject, fmt)
        return None if found is None else _registered(subject, found)

    def subjects(self) -> list[str]:
        """Every subject the registry holds (not the deleted ones)."""
        found = self._ask("the subjects", lambda _, fmt: self._client.get_subjects(), None,
                          None)
        return list(found or [])

    def versions(self, subject: str) -> list[int]:
        """The subject's registered version numbers, oldest first ([] when no subject)."""
        found = self._ask(f"versions of {subject}",
                          lambda s, fmt: self._client.get_versions(s), subject, None)
        return sorted(found or [])

    def version(self, subject: str, number: int, *,
                serialized: bool = False) -> WriterSchema | None:
        """Version ``number`` of the subject, or None when there is no such version."""
        return self._resolved(_fetched(lambda fmt: self._version(subject, number, fmt),
                                       serialized), serialized)

    def _version(self, subject: str, number: int, fmt: str | None, *,
                 deleted: bool = False) -> WriterSchema | None:
        found = self._ask(f"version {number} of {subject}",
                          lambda s, fmt: self._client.get_version(s, number, deleted, fmt=fmt),
                          subject, fmt)
        return None if found is None else _registered(subject, found)

    def _resolved(self, found: WriterSchema | None, serialized: bool,
                  chain: tuple[tuple[str, int], ...] = ()) -> WriterSchema | None:
        """``found`` with the schemas it references (see :class:`Reference`)."""
        if found is None or not found.references:
            return found
        return replace(found, references=tuple(
            replace(ref, schema=self._reference(ref, serialized, chain))
            for ref in found.references))

    def _reference(self, ref: Reference, serialized: bool,
                   chain: tuple[tuple[str, int], ...]) -> WriterSchema | None:
        """The subject version ``ref`` names, resolved; fetched once per client. A version
        deleted softly still serves the schemas that reference it (as the serializers
        read it: ``deleted=true``)."""
        at = (ref.subject, ref.version)
        if not ref.subject or ref.version < 0 or at in chain or len(chain) >= \
                MAX_REFERENCE_DEPTH:
            return None
        key = (ref.subject, ref.version, serialized)
        if key not in self._referenced:
            found = _fetched(lambda fmt: self._version(ref.subject, ref.version, fmt,
                                                       deleted=True), serialized)
            self._referenced[key] = self._resolved(found, serialized, (*chain, at))
        return self._referenced[key]

    @staticmethod
    def _ask(operation: str, request: Any, what: Any, fmt: str | None) -> Any:
        """One request: its answer, None for "not found", else the mapped error."""
        try:
            return request(what, fmt=fmt)
        except Exception as exc:
            if _is_registry_error(exc) and exc.error_code in NOT_FOUND:
                return None
            raise map_registry_error(operation, exc) from exc


def _fetched(ask: Callable[[str | None], WriterSchema | None],
             serialized: bool) -> WriterSchema | None:
    """A schema as the registry stores it; with ``serialized``, one stored as ``.proto``
    source is asked for again as a serialized descriptor (see :func:`is_descriptor`)."""
    found = ask(None)
    if found is not None and serialized and not is_descriptor(found.text):
        found = ask("serialized")
    return found


def _registered(subject: str, found: Any) -> WriterSchema:
    """A ``RegisteredSchema`` (a subject's version) as a :class:`WriterSchema`."""
    schema = found.schema
    return WriterSchema(found.schema_id or 0, schema.schema_type or "AVRO",
                        schema.schema_str or "", subject=subject, version=found.version,
                        references=_references(schema.references))


def _references(found: Any) -> tuple[Reference, ...]:
    """The client's ``SchemaReference`` list as :class:`Reference` s, not yet resolved (one
    without a subject or a version is kept, to be refused by name)."""
    return tuple(Reference(ref.name or "", ref.subject or "",
                           -1 if ref.version is None else int(ref.version))
                 for ref in found or ())


__all__ = ["DEFAULTS", "MAX_REFERENCE_DEPTH", "Reference", "RegistrySettings", "SchemaRegistry",
           "WriterSchema", "client_api", "is_descriptor", "map_registry_error",
           "registry_settings_from"]
