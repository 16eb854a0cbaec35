"""JupyterHub's internal SSL, end to end with certificates made here.

The test makes a CA, a server certificate for 127.0.0.1 and client certificates (one from
that CA, one from a stranger CA), then runs a real gateway process that reads
JUPYTERHUB_SSL_KEYFILE/CERTFILE/CLIENT_CA as JupyterHub hands them to a managed service:
it serves HTTPS and asks every client for a certificate of the CA. Every client of the
gateway goes through it: the blocking and the async client, the SSE stream, the spawner's
client (with the Hub's own certificate, from the Hub's settings) and the Hub's event
stream.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from gwutil import TOKENS, gateway_env, launch_gateway
from helpers import wait_until

from jupyter_gpuaas.client import (
    GatewayClient,
    GatewayError,
    SyncGatewayClient,
    ssl_context,
    ssl_context_from_env,
)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key: Any, cert: x509.Certificate) -> tuple[str, str]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".crt")
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


def make_ca(path: Path, cn: str) -> tuple[Any, x509.Certificate, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _, cert_path = _write(path, key, cert)
    return key, cert, cert_path


def make_leaf(
    path: Path, cn: str, ca_key: Any, ca_cert: x509.Certificate, server: bool
) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
                if server
                else [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return _write(path, key, builder.sign(ca_key, hashes.SHA256()))


@dataclass
class Pki:
    ca: str
    server: tuple[str, str]  # key, cert
    client: tuple[str, str]
    stranger: tuple[str, str]  # a client certificate from a CA the gateway does not trust


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    tmp_path = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert, ca = make_ca(tmp_path / "internal-ca", "gpuaas test internal CA")
    other_key, other_cert, _ = make_ca(tmp_path / "other-ca", "somebody else's CA")
    return Pki(
        ca=ca,
        server=make_leaf(tmp_path / "gateway", "gpuaas", ca_key, ca_cert, server=True),
        client=make_leaf(tmp_path / "user", "jupyter-alice", ca_key, ca_cert, server=False),
        stranger=make_leaf(tmp_path / "stranger", "eve", other_key, other_cert, server=False),
    )


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    """A gateway process given JupyterHub's internal-SSL environment; its https URL. One
    for the module (a start costs seconds): no test here needs it empty."""
    tmp_path = tmp_path_factory.mktemp("tls-gateway")
    env = gateway_env(
        JUPYTERHUB_SSL_KEYFILE=pki.server[0],
        JUPYTERHUB_SSL_CERTFILE=pki.server[1],
        JUPYTERHUB_SSL_CLIENT_CA=pki.ca,
    )
    probe = ssl_context(pki.client[0], pki.client[1], pki.ca)
    gp = launch_gateway(tmp_path, f"sqlite:///{tmp_path / 'g.sqlite'}", env=env, context=probe)
    try:
        yield gp.url
    finally:
        gp.stop()


@pytest.fixture
def internal_ssl_env(monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    """What a single-user server (or a job) finds under internal SSL."""
    monkeypatch.setenv("JUPYTERHUB_SSL_KEYFILE", pki.client[0])
    monkeypatch.setenv("JUPYTERHUB_SSL_CERTFILE", pki.client[1])
    monkeypatch.setenv("JUPYTERHUB_SSL_CLIENT_CA", pki.ca)


def test_the_context_is_built_once(pki: Pki, internal_ssl_env: None) -> None:
    assert ssl_context_from_env() is ssl_context_from_env()
    assert ssl_context_from_env({}) is None
    with pytest.raises(GatewayError, match=r"JUPYTERHUB_SSL_CERTFILE"):
        ssl_context_from_env({"JUPYTERHUB_SSL_CERTFILE": "/nonexistent.crt"})


def test_sync_client_over_internal_ssl(tls_gateway: str, pki: Pki, internal_ssl_env: None) -> None:
    me = SyncGatewayClient(tls_gateway, TOKENS["alice"]).me()
    assert me["name"] == "alice"
    # No client certificate: the gateway ends the handshake.
    no_cert = ssl.create_default_context(cafile=pki.ca)
    with pytest.raises(GatewayError) as e:
        SyncGatewayClient(tls_gateway, TOKENS["alice"], ssl_context=no_cert).me()
    assert e.value.status == 0 and "cannot reach the gateway" in str(e.value)
    # A certificate of a CA the gateway does not trust: refused too.
    stranger = ssl_context(pki.stranger[0], pki.stranger[1], pki.ca)
    with pytest.raises(GatewayError):
        SyncGatewayClient(tls_gateway, TOKENS["alice"], ssl_context=stranger).me()
    # A client that does not trust the internal CA refuses the gateway's certificate.
    with pytest.raises(GatewayError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
        plain = ssl.create_default_context()
        SyncGatewayClient(tls_gateway, TOKENS["alice"], ssl_context=plain).me()


@pytest.mark.asyncio
async def test_async_client_and_event_stream_over_internal_ssl(
    tls_gateway: str, internal_ssl_env: None
) -> None:
    alice = GatewayClient(tls_gateway, TOKENS["alice"])
    heard: list[dict[str, Any]] = []

    async def listen() -> None:
        async for ev in alice.events(comments=True):
            heard.append(ev)

    task = asyncio.ensure_future(listen())
    try:
        await wait_until(lambda: heard, 10, "the stream's first line", interval=0.05)
        assert heard and heard[0]["comment"] == "connected", heard
        req = await alice.submit("vision", "kernel", 1)
        await wait_until(
            lambda: any(e.get("event") == "admit" for e in heard), 10, "the admit event",
            interval=0.05,
        )  # fmt: skip
        admit = next(e for e in heard if e.get("event") == "admit")
        assert admit["data"]["id"] == req["id"]
    finally:
        task.cancel()


@pytest.mark.asyncio
async def test_the_spawner_and_the_hub_stream_use_the_hubs_certificate(
    tls_gateway: str, pki: Pki
) -> None:
    """The Hub process has no JUPYTERHUB_SSL_* of its own: the spawner takes the Hub's
    internal_ssl_key/cert/ca from the Hub's settings (as JupyterHub's User does)."""
    from jupyter_gpuaas.holder import EventFollower
    from jupyter_gpuaas.hub import QueuedSimpleLocalProcessSpawner

    assert "JUPYTERHUB_SSL_CERTFILE" not in os.environ
    settings = {
        "internal_ssl": True,
        "internal_ssl_key": pki.client[0],
        "internal_ssl_cert": pki.client[1],
        "internal_ssl_ca": pki.ca,
    }
    spawner = QueuedSimpleLocalProcessSpawner(
        gateway_url=tls_gateway, gateway_token=TOKENS["carol"]
    )
    spawner.user = SimpleNamespace(name="alice", settings=settings)
    tenants = await spawner._reader_client().tenants()
    assert {t["name"] for t in tenants["tenants"]} == {"vision", "nlp"}
    # without the Hub's certificate the same call is refused
    spawner.user = SimpleNamespace(name="alice", settings={})
    with pytest.raises(GatewayError):
        await spawner._reader_client().tenants()

    connected = asyncio.Event()
    stream = EventFollower(GatewayClient(tls_gateway, TOKENS["carol"], ssl_context=ssl_context(
        pki.client[0], pki.client[1], pki.ca)))  # fmt: skip
    unsubscribe = stream.subscribe(
        lambda e: connected.set() if e.get("event") == "connected" else None
    )
    try:
        await asyncio.wait_for(connected.wait(), 15)
    finally:
        unsubscribe()
        if stream._task is not None:
            stream._task.cancel()
