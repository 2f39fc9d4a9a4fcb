"""TLS interception: the virtual web terminates the TLS of a ``CONNECT host:443`` tunnel itself, with
a certificate for that host signed by a CA made at start-up (clients that verify are given the CA's
PEM: :attr:`enrich_crawl.virtualweb.VirtualWeb.ca_pem`)."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import ssl
import tempfile
from pathlib import Path


class CertificateAuthority:
    """A CA made at start-up and one certificate per host (SAN = the host), signed by it, cached."""

    def __init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self._x509, self._hashes, self._ec = x509, hashes, ec
        self._NameOID, self._EKU = NameOID, ExtendedKeyUsageOID
        self._dir = tempfile.TemporaryDirectory(prefix="virtual-web-tls-")
        self._contexts: dict[str, ssl.SSLContext] = {}
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(days=1)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "enrich-crawl virtual web CA")])
        self._ca_name = name
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_pem = self._ca_cert.public_bytes(serialization.Encoding.PEM)
        self._key_file = Path(self._dir.name) / "leaf.key"
        self._key_file.write_bytes(
            self._leaf_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self._pem = serialization.Encoding.PEM

    def context(self, host: str) -> ssl.SSLContext:
        ctx = self._contexts.get(host)
        if ctx is not None:
            return ctx
        x509, NameOID = self._x509, self._NameOID
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_name)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_before + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([self._EKU.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
            .sign(self._ca_key, self._hashes.SHA256())
        )
        cert_file = Path(self._dir.name) / f"{hashlib.sha1(host.encode()).hexdigest()}.pem"
        cert_file.write_bytes(cert.public_bytes(self._pem) + self.ca_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, self._key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        self._contexts[host] = ctx
        return ctx

    def cleanup(self) -> None:
        self._dir.cleanup()


async def start_tls(writer: asyncio.StreamWriter, ctx: ssl.SSLContext) -> None:
    if hasattr(writer, "start_tls"):  # Python 3.11+
        await writer.start_tls(ctx, ssl_handshake_timeout=15)
        return
    # Python 3.10: the same steps as StreamWriter.start_tls of 3.11.
    loop = asyncio.get_running_loop()
    protocol = writer.transport.get_protocol()
    await writer.drain()
    transport = await loop.start_tls(
        writer.transport, protocol, ctx, server_side=True, ssl_handshake_timeout=15
    )
    writer._transport = transport  # type: ignore[attr-defined]
    protocol._transport = transport  # type: ignore[attr-defined]
    protocol._over_ssl = True  # type: ignore[attr-defined]
