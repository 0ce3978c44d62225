"""Throwaway TLS certificates for the TLS tests: a CA, a server and a client certificate.

The TLS tests run a real TLS-only redis-server, which needs a certificate and a key, and
a CA to check client certificates against (``--tls-auth-clients yes``). Nothing is
checked in: :func:`make_tls_files` writes a fresh CA, a server certificate for
``127.0.0.1`` (``subjectAltName = IP:127.0.0.1``, so that the client's hostname check,
on by default in redis-py, passes for the address it dials) and a client certificate,
all signed by that CA and valid for two days.

They are made with the ``openssl`` command line when it is on PATH, else with the
``cryptography`` package (a dependency of Scrapy, so always installed with this
package). Keys are ECDSA on P-256: accepted by every OpenSSL and Redis TLS build, and
made in milliseconds where RSA keys take a good part of a second each.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Backend = Literal["openssl", "cryptography"]

#: Days the certificates are valid: the tests need minutes, a clock skew needs slack.
VALID_DAYS = 2

_CA_EXTENSIONS = """\
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""
_SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
_CLIENT_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
#: ``openssl req`` arguments for a new P-256 key.
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
#: A minimal configuration, so that the system's openssl.cnf adds nothing of its own.
_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
{ca}
[server]
{server}
[client]
{client}
"""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of one certificate set, all under ``directory``.

    ``ca_cert`` signed both ``server_cert`` and ``client_cert``; it is what a client
    passes as ``ssl_ca_certs`` and the server as ``--tls-ca-cert-file``.
    """

    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def available_backend() -> Backend:
    """Return how certificates are made here: ``openssl`` on PATH, else ``cryptography``."""
    return "openssl" if shutil.which("openssl") else "cryptography"


def make_tls_files(directory: Path, backend: Backend | None = None) -> TlsFiles:
    """Write a fresh CA, server and client certificate (and keys) into ``directory``.

    ``backend`` forces one way of making them; by default :func:`available_backend`.
    Each call makes a new CA: certificates of two calls do not trust each other, which
    is how the tests get a wrong CA.
    """
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(
        directory=directory,
        ca_cert=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )
    if (backend or available_backend()) == "openssl":
        _with_openssl(files)
    else:
        _with_cryptography(files)
    return files


def _openssl(*args: str) -> None:
    """Run ``openssl`` with ``args``; raise RuntimeError with its output if it fails."""
    done = subprocess.run(
        ["openssl", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


def _with_openssl(files: TlsFiles) -> None:
    """Make the certificate set with the ``openssl`` command line (OpenSSL or LibreSSL)."""
    cnf = files.directory / "openssl.cnf"
    cnf.write_text(
        _OPENSSL_CNF.format(ca=_CA_EXTENSIONS, server=_SERVER_EXTENSIONS, client=_CLIENT_EXTENSIONS)
    )
    ca_key = files.directory / "ca.key"
    days = str(VALID_DAYS)
    _openssl(
        "req", "-x509", "-new", "-config", str(cnf), "-extensions", "ca",
        *_EC_KEY, "-nodes", "-keyout", str(ca_key), "-out", str(files.ca_cert),
        "-days", days, "-subj", "/CN=scrapy-redis-bloom test CA",
    )  # fmt: skip
    leaves = (
        ("server", files.server_cert, files.server_key, "/CN=127.0.0.1", 2),
        ("client", files.client_cert, files.client_key, "/CN=scrapy-redis-bloom test client", 3),
    )
    for section, cert, key, subject, serial in leaves:
        csr = files.directory / f"{section}.csr"
        _openssl(
            "req", "-new", "-config", str(cnf), *_EC_KEY, "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(files.ca_cert), "-CAkey", str(ca_key),
            "-set_serial", str(serial), "-days", days, "-extfile", str(cnf),
            "-extensions", section, "-out", str(cert),
        )  # fmt: skip


def _with_cryptography(files: TlsFiles) -> None:
    """Make the certificate set with the ``cryptography`` package."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def key_usage(ca: bool) -> x509.KeyUsage:
        """Return the key usage of a CA (signs certificates) or a leaf (handshakes)."""
        return x509.KeyUsage(
            digital_signature=not ca,
            content_commitment=False,
            key_encipherment=not ca,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=ca,
            crl_sign=ca,
            encipher_only=False,
            decipher_only=False,
        )

    now = datetime.datetime.now(datetime.UTC)
    ca_name = name("scrapy-redis-bloom test CA")

    def certificate(
        subject: x509.Name, key: ec.EllipticCurvePrivateKey, serial: int, ca: bool
    ) -> x509.CertificateBuilder:
        """Start a certificate issued by the test CA, valid from an hour ago."""
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(key_usage(ca), critical=True)
        )

    ca_key = new_key()
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        certificate(ca_name, ca_key, 1, ca=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_key(ca_key, files.directory / "ca.key")

    leaves = (
        (files.server_cert, files.server_key, "127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, 2),
        (
            files.client_cert,
            files.client_key,
            "scrapy-redis-bloom test client",
            ExtendedKeyUsageOID.CLIENT_AUTH,
            3,
        ),
    )
    for cert_path, key_path, common_name, usage, serial in leaves:
        key = new_key()
        builder = (
            certificate(name(common_name), key, serial, ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                critical=False,
            )
        )
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(common_name))]),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(key, key_path)
