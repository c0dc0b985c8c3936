"""A test certificate authority for a swarm's mutual TLS (``sfg tls-ca``), one key bundle per node.

``make_test_ca(DIR, nodes)`` writes:

* ``DIR/ca.pem``: the swarm CA's certificate (public);
* ``DIR/node-<id>/`` for every node (a folder of mode 0700): its **bundle**, the only thing a
  machine running node ``<id>`` receives — ``ca.pem``, every node's public certificate
  ``node-<j>.pem`` (a receiver checks each sender's identity and, with ``+certified``, its
  signatures against them) and this node's own private keys only: ``node-<id>.key`` (TLS)
  and ``node-<id>.sign`` (Ed25519 header signing);
* the CA's private key nowhere, unless asked (``keep_ca_key``: ``DIR/ca-key/ca.key``, a
  folder of its own that no bundle contains). Nothing in sfg reads it back; with it
  one could mint certificates for any node id.

Each certificate is EC P-256, signed by the CA, with the common name ``node-<id>`` — the
identity a receiver checks against the message header and a ``Fetch`` request (docs/concepts/nodes.md#wire-format-and-trust) —
and names ``localhost``, ``127.0.0.1``, ``::1`` and any extra hosts (``--host``). A node's
header-signing key's public half is an extension of its certificate (:data:`SIGNING_KEY_OID`),
so the CA's signature binds it to the TLS identity ``node-<id>``.

Private files are written by one helper, :func:`write_private`: created with
``os.open(O_CREAT | O_EXCL | O_WRONLY, 0o600)`` inside a folder of mode 0700, so they are
never readable by group or others, whatever the umask (tested under umask 0). Existing keys are
not replaced unless ``force``. For tests and trials: keys are unencrypted.

A node loads its bundle (:func:`bundle_dir`, :class:`sfg.net.transport.TlsFiles`,
:class:`sfg.net.certify.Keys`); a folder holding another node's or the CA's private key is
refused. A node whose own certificate is outside its validity period stops at start
(:func:`check_validity`).
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


def private_dir(path: Path) -> Path:
    """Create folder ``path`` (and its parents) with mode 0700, owner only, from the start
    (an existing one is made 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes, *, force: bool = False) -> None:
    """Write a private key: the file is created with mode 0600 (``O_CREAT | O_EXCL``: never
    with wider permissions, never into a file that exists — another user's pre-made one, or
    a key); ``force`` removes an existing file first."""
    if force:
        path.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_public(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def bundle_dir(tls_dir: str | Path, node: int) -> Path:
    """Where node ``node`` loads its TLS and signing keys from: ``tls_dir/node-<id>/`` when
    ``tls_dir`` is a whole ``sfg tls-ca`` folder (``sfg swarm``: every node on one machine),
    else ``tls_dir`` itself (a bundle, as ``sfg node`` gets on its machine)."""
    d = Path(tls_dir)
    sub = d / f"node-{int(node)}"
    return sub if sub.is_dir() else d


def check_bundle(d: Path, node: int) -> None:
    """Refuse a folder that holds the CA's or another node's private key: one node's bundle
    holds its own keys only (an old ``sfg tls-ca`` folder gave every node every key)."""
    mine = {f"node-{int(node)}.key", f"node-{int(node)}.sign"}
    foreign = sorted(p.name for p in d.iterdir() if p.suffix in (".key", ".sign")
                     and p.name not in mine) if d.is_dir() else []
    if foreign:
        raise SfgError(f"{d} holds private keys other than node {node}'s ({', '.join(foreign[:3])}"
                       f"{', ...' if len(foreign) > 3 else ''}); give node {node} its own bundle: "
                       f"`sfg tls-ca --dir DIR --nodes N` writes DIR/node-{node}/")


def check_validity(cert, what: str, now: dt.datetime | None = None) -> None:
    """SfgError unless ``now`` (default: the wall clock) lies in the certificate's validity
    period."""
    now = now or dt.datetime.now(dt.timezone.utc)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if not start <= now <= end:
        raise SfgError(f"{what} is valid from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} "
                       f"UTC, not now ({now:%Y-%m-%d %H:%M} UTC); make new certificates with "
                       "`sfg tls-ca --dir DIR --nodes N --force` (and check this machine's clock)")


def make_test_ca(directory: str | Path, nodes, *, hosts=(), days: float = 30,
                 ca_name: str = "sfg test CA", keep_ca_key: bool = False, force: bool = False,
                 validity: dict[int, tuple[dt.datetime, dt.datetime]] | None = None) -> Path:
    """Create ``ca.pem`` and one bundle per node id in ``nodes`` (see the module docstring);
    returns the folder. ``validity``: a node's own (not-before, not-after), for tests of
    expired certificates; otherwise from five minutes ago for ``days`` days. Raises
    :class:`SfgError` before writing anything if a key exists and not ``force``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    ids = sorted({int(i) for i in nodes})
    if not ids or min(ids) < 0:
        raise SfgError("give at least one node id >= 0 (e.g. --nodes 8 for ids 0..7)")
    d = Path(directory)
    keys = [d / f"node-{i}" / f"node-{i}.{ext}" for i in ids for ext in ("key", "sign")]
    keys += [d / "ca-key" / "ca.key"] if keep_ca_key else []
    # an old (flat) folder: every node's keys side by side, and the CA's
    keys += [p for p in (d / "ca.key", *(d / f"node-{i}.{e}" for i in ids for e in ("key", "sign")))
             if p.exists()]
    existing = [p for p in keys if p.exists()]
    if existing and not force:
        raise SfgError(f"{existing[0]} exists; keys are not replaced (every node would need "
                       "its new bundle); add --force to make new ones")
    private_dir(d)
    for p in existing:  # --force: the old keys go first, whatever is written next
        if p.parent == d:
            p.unlink()
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    period = {i: (validity or {}).get(i, (now, now + dt.timedelta(days=days))) for i in ids}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name(ca_name)).issuer_name(_name(ca_name))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(min(now, *(v[0] for v in period.values())))
               .not_valid_after(max(v[1] for v in period.values()))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA256()))
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    _write_public(d / "ca.pem", ca_pem)
    if keep_ca_key:
        write_private(private_dir(d / "ca-key") / "ca.key", _pem_key(ca_key), force=force)
    alt: list = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.IPAddress(ipaddress.ip_address("::1"))]
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    oid = x509.ObjectIdentifier(SIGNING_KEY_OID)
    certs: dict[int, bytes] = {}
    private: dict[int, tuple[bytes, bytes]] = {}
    for i in ids:
        key = ec.generate_private_key(ec.SECP256R1())
        signing = ed25519.Ed25519PrivateKey.generate()
        raw_public = signing.public_key().public_bytes(serialization.Encoding.Raw,
                                                       serialization.PublicFormat.Raw)
        start, end = period[i]
        cert = (x509.CertificateBuilder().subject_name(_name(f"node-{i}"))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                # node-<id> as a name too: a pull's channel checks the replier is that node
                # (sfg.net.transport.Peer.pull, docs/concepts/nodes.md#returns-in-the-node)
                .add_extension(x509.SubjectAlternativeName([*alt, x509.DNSName(f"node-{i}")]),
                               critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                      x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .add_extension(x509.UnrecognizedExtension(oid, raw_public), critical=False)
                .sign(ca_key, hashes.SHA256()))
        certs[i] = cert.public_bytes(serialization.Encoding.PEM)
        private[i] = (_pem_key(key), _pem_key(signing))
    for i in ids:
        b = private_dir(d / f"node-{i}")
        _write_public(b / "ca.pem", ca_pem)
        for j, pem in certs.items():
            _write_public(b / f"node-{j}.pem", pem)
        write_private(b / f"node-{i}.key", private[i][0], force=force)
        write_private(b / f"node-{i}.sign", private[i][1], force=force)
    return d
