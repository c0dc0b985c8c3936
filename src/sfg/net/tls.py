"""A test certificate authority for a swarm's mutual TLS (``sfg tls-ca``).

Writes into a folder: ``ca.pem`` (the swarm CA), and for every node ``node-<id>.pem`` /
``node-<id>.key`` — an EC P-256 certificate signed by the CA whose common name ``node-<id>`` is
the identity a receiver checks against the message header (SPEC §11.3). Certificates name
``localhost``, ``127.0.0.1`` and any extra hosts (``--host``) so that they are valid for those
addresses. For tests and trials: keys are written unencrypted (mode 0600).

Every node also gets a header-signing key, ``node-<id>.sign`` (Ed25519, for ``+certified``,
:mod:`sfg.net.certify`): its public half is an extension of the node's certificate
(:data:`SIGNING_KEY_OID`), so the CA's signature binds it to the TLS identity ``node-<id>``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from sfg.errors import SfgError

# the certificate extension holding a node's raw 32-byte Ed25519 header-signing public key
# (an OID of the UUID arc 2.25, ITU-T X.667: needs no registration)
SIGNING_KEY_OID = "2.25.71850958979037019768775695860008259139"


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sfg swarm")])


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def make_test_ca(directory: str | Path, nodes, *, hosts=(), days: int = 30,
                 ca_name: str = "sfg test CA") -> Path:
    """Create ``ca.pem`` and a certificate + key for every node id in ``nodes``; returns the folder."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    ids = [int(i) for i in nodes]
    if not ids or min(ids) < 0:
        raise SfgError("give at least one node id >= 0 (e.g. --nodes 8 for ids 0..7)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name(ca_name)).issuer_name(_name(ca_name))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA256()))
    _write(d / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(d / "ca.key", _pem_key(ca_key), private=True)
    alt: list = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.IPAddress(ipaddress.ip_address("::1"))]
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    oid = x509.ObjectIdentifier(SIGNING_KEY_OID)
    for i in ids:
        key = ec.generate_private_key(ec.SECP256R1())
        signing = ed25519.Ed25519PrivateKey.generate()
        raw_public = signing.public_key().public_bytes(serialization.Encoding.Raw,
                                                       serialization.PublicFormat.Raw)
        cert = (x509.CertificateBuilder().subject_name(_name(f"node-{i}"))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                      x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .add_extension(x509.UnrecognizedExtension(oid, raw_public), critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write(d / f"node-{i}.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write(d / f"node-{i}.key", _pem_key(key), private=True)
        _write(d / f"node-{i}.sign", _pem_key(signing), private=True)
    return d
