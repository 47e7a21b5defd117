"""Certificates and node keys of a deployment with TLS and SuperNode authentication.

- a certificate authority (:func:`make_ca`): ECDSA P-384, self-signed;
- the SuperLink's certificate (:func:`server_certificate`), signed by that CA,
  naming the SuperLink's host name (subjectAltName DNS), which SuperNodes check;
- one key pair per SuperNode (:func:`node_key`): ECDSA P-384, the private key
  in OpenSSH format (what ``flower-supernode --auth-supernode-private-key``
  loads) and the public key in OpenSSH format (what ``flwr supernode register``
  loads), as ``ssh-keygen -t ecdsa -b 384`` writes them.

Every private key file is written with mode 0600 (created so, never wider).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class Pair:
    """A certificate (or public key) file and its private key file."""

    cert: Path
    key: Path


def _write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to a new file of mode 0600 (an old one is replaced)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def make_ca(folder: Path, name: str = "se-ca") -> Pair:
    """A self-signed CA: ``<folder>/<name>.crt`` and ``<name>.key`` (0600).

    Raises
    ------
    OSError
        ``folder`` cannot be written.
    """
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (_builder(name, subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False), critical=True)
            .sign(key, hashes.SHA384()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Pair(folder / f"{name}.crt", _write_private(folder / f"{name}.key",
                                                       _pem_key(key)))


def server_certificate(ca: Pair, folder: Path, hostname: str,
                       name: str = "superlink", addresses: tuple[str, ...] = ()) -> Pair:
    """A server certificate for ``hostname`` (CN and DNS SAN), signed by ``ca``.

    ``addresses``: IP addresses it names too (IP SANs). The SuperLink's own
    SuperExec, which starts the ServerApp, connects to the address given as
    ``--host``, not to a name: without that address in the certificate its TLS
    check fails and no run ever starts (flwr 1.42, seen here). Writes
    ``<folder>/<name>.pem`` and ``<name>.key`` (0600).

    Raises
    ------
    ValueError
        ``hostname`` is empty or has characters a DNS name cannot have, or an
        address is not an IP address.
    """
    if not hostname or not all(c.isalnum() or c in ".-" for c in hostname):
        raise ValueError(f"hostname {hostname!r} is not allowed: a DNS name "
                         "(letters, digits, '.', '-')")
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (_builder(hostname, ca_cert.subject, key.public_key())
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(hostname),
                 *(x509.IPAddress(ipaddress.ip_address(a)) for a in addresses)]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA384()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Pair(folder / f"{name}.pem", _write_private(folder / f"{name}.key",
                                                       _pem_key(key)))


def node_key(path: Path) -> Pair:
    """An ECDSA P-384 key pair: ``path`` (OpenSSH private, 0600) and ``path.pub``.

    Returns ``Pair(cert=<path>.pub, key=<path>)``.
    """
    key = ec.generate_private_key(ec.SECP384R1())
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    public = path.with_name(path.name + ".pub")
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return Pair(public, path)
