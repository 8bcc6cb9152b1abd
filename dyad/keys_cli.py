"""`dyad keys`: make a cluster's credentials, one directory holding all of them.

    dyad keys generate DIR [--principal NAME ...] [--host NAME ...]
    dyad keys cert DIR NAME --host HOST ...     # a server certificate for one machine
    dyad keys rotate DIR PRINCIPAL              # a new key and token; the old stay valid
    dyad keys retire DIR PRINCIPAL              # drop all but the newest key and token
    dyad keys hash-password                     # a password hash for credentials.json

`generate` writes (secrets mode 0600 in 0700 directories)::

    DIR/credentials.json        principal -> CURVE public keys, token and password hashes
    DIR/acls.json               starting ACLs (dyad.authz): deny unless allowed
    DIR/curve/P.key             CURVE public key of principal P (share freely)
    DIR/curve/P.key_secret      CURVE secret key of P (give only to P's processes)
    DIR/tokens/P.token          HTTP bearer token of P
    DIR/tls/ca.pem, ca-key.pem  the cluster's certificate authority
    DIR/tls/server.pem, server-key.pem   a server certificate for --host names
    DIR/zookeeper.digest        user:password for ZooKeeper digest authentication

Everything is new randomness: running it twice gives two clusters that do not
trust each other. It refuses to write over an existing credentials.json.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import ipaddress
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dyad import auth

DEFAULT_PRINCIPALS = ("master", "agent", "service", "batch", "operator")
FRAMEWORK_PRINCIPALS = ("service", "batch")
ZK_USER = "dyad"
CERT_DAYS = 825


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_json(path: Path, doc: Any) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)


# ---------------------------------------------------------------- TLS

def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Dyad"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)) \
        .not_valid_after(now + datetime.timedelta(days=days)) \
        .serial_number(x509.random_serial_number())


def create_ca(tls_dir: Path, days: int = CERT_DAYS) -> None:
    """A self-signed CA: `ca.pem` (give to every client) and `ca-key.pem` (keep)."""
    _private_dir(tls_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(f"Dyad CA {secrets.token_hex(4)}")
    cert = _validity(x509.CertificateBuilder(), days).subject_name(subject) \
        .issuer_name(subject).public_key(key.public_key()) \
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True) \
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True) \
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False) \
        .sign(key, hashes.SHA256())
    _write_secret(tls_dir / "ca-key.pem", _pem_key(key))
    (tls_dir / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_certificate(tls_dir: Path, name: str, hosts: Sequence[str],
                      days: int = CERT_DAYS) -> tuple[Path, Path]:
    """`name.pem` and `name-key.pem`: a server (and client) certificate for `hosts`,
    signed by the CA in `tls_dir`."""
    if not hosts:
        raise ValueError("a certificate needs at least one --host")
    ca_key = serialization.load_pem_private_key((tls_dir / "ca-key.pem").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((tls_dir / "ca.pem").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _validity(x509.CertificateBuilder(), days).subject_name(_name(hosts[0])) \
        .issuer_name(ca_cert.subject).public_key(key.public_key()) \
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False) \
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True) \
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False) \
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False) \
        .sign(ca_key, hashes.SHA256())
    cert_path, key_path = tls_dir / f"{name}.pem", tls_dir / f"{name}-key.pem"
    _write_secret(key_path, _pem_key(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def default_hosts() -> list[str]:
    return list(dict.fromkeys(["localhost", "127.0.0.1", "::1", socket.gethostname()]))


# --------------------------------------------------------- principals

def _new_identity(directory: Path, principal: str) -> tuple[bytes, str]:
    """Fresh CURVE keys and token files for `principal`; returns (public key, token hash)."""
    public_path, _ = auth.create_keys(_private_dir(directory / "curve"), principal)
    token = auth.new_token()
    _write_secret(_private_dir(directory / "tokens") / f"{principal}.token", token.encode())
    return auth.load_keys(public_path).public, auth.hash_token(token)


def default_acls(principals: Iterable[str]) -> dict[str, Any]:
    """Starting ACLs: agents register, the demo frameworks run in any role as any
    user and act on their own tasks, the operator and master may do anything,
    everyone may view state. Tighten `run_task` before leaving a laptop."""
    names = set(principals)
    frameworks = sorted(names & set(FRAMEWORK_PRINCIPALS))
    rules: list[dict[str, Any]] = [
        {"effect": "allow", "principals": ["*"], "actions": ["view_state"]},
    ]
    if "agent" in names:
        rules.append({"effect": "allow", "principals": ["agent"], "actions": ["register_agent"]})
    if frameworks:
        rules.append({"effect": "allow", "principals": frameworks,
                      "actions": ["register_framework", "run_task"], "objects": ["*"]})
    admins = sorted(names & {"operator", "master"})
    if admins:
        rules.append({"effect": "allow", "principals": admins, "actions": ["*"],
                      "objects": ["*"]})
    return {"permissive": False, "rules": rules}


def generate(directory: Path, principals: Sequence[str] = DEFAULT_PRINCIPALS,
             hosts: Sequence[str] | None = None, days: int = CERT_DAYS) -> auth.Credentials:
    """Write a whole cluster's credentials under `directory` (see the module doc)."""
    for name in principals:
        auth.check_principal(name)
    _private_dir(directory)
    if (directory / "credentials.json").exists():
        raise FileExistsError(f"{directory / 'credentials.json'} exists; "
                              "use `dyad keys rotate` to change a principal's keys")
    entries = {}
    for name in dict.fromkeys(principals):
        public, token_hash = _new_identity(directory, name)
        entries[name] = auth.PrincipalEntry((public,), (token_hash,))
    credentials = auth.Credentials(entries)
    create_ca(directory / "tls", days)
    issue_certificate(directory / "tls", "server", list(hosts or default_hosts()), days)
    _write_secret(directory / "zookeeper.digest",
                  f"{ZK_USER}:{secrets.token_urlsafe(24)}\n".encode())
    _write_json(directory / "acls.json", default_acls(entries))
    _write_json(directory / "credentials.json", credentials.to_json())
    return credentials


def rotate(directory: Path, principal: str) -> auth.Credentials:
    """Give `principal` a new key pair and token; its old public key and token
    stay valid (renamed `*.old`) until `retire`, so processes can restart one by one."""
    credentials = auth.load_credentials(directory / "credentials.json")
    entry = credentials.principals.get(principal, auth.PrincipalEntry())
    for path in (directory / "curve" / f"{principal}.key",
                 directory / "curve" / f"{principal}.key_secret",
                 directory / "tokens" / f"{principal}.token"):
        if path.exists():
            os.replace(path, path.with_name(path.name + ".old"))
    public, token_hash = _new_identity(directory, auth.check_principal(principal))
    principals = dict(credentials.principals)
    principals[principal] = auth.PrincipalEntry(entry.curve_keys + (public,),
                                                entry.token_hashes + (token_hash,),
                                                entry.password_hash)
    updated = auth.Credentials(principals)
    _write_json(directory / "credentials.json", updated.to_json())
    return updated


def retire(directory: Path, principal: str) -> auth.Credentials:
    """Keep only `principal`'s newest key and token; delete the `*.old` files."""
    credentials = auth.load_credentials(directory / "credentials.json")
    entry = credentials.principals.get(principal)
    if entry is None:
        raise KeyError(f"no principal {principal!r} in {directory / 'credentials.json'}")
    principals = dict(credentials.principals)
    principals[principal] = auth.PrincipalEntry(entry.curve_keys[-1:], entry.token_hashes[-1:],
                                                entry.password_hash)
    for old in (*(directory / "curve").glob(f"{principal}.key*.old"),
                *(directory / "tokens").glob(f"{principal}.token.old")):
        old.unlink()
    updated = auth.Credentials(principals)
    _write_json(directory / "credentials.json", updated.to_json())
    return updated


# ----------------------------------------------------------------- CLI

def add_parser(commands: Any) -> None:
    keys = commands.add_parser("keys", help="make a cluster's keys, certificates and "
                                            "credentials")
    _fill_parser(keys)


def _fill_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="keys_command", required=True)
    gen = actions.add_parser("generate", help="everything a new cluster needs")
    gen.add_argument("directory", type=Path)
    gen.add_argument("--principal", action="append", default=None,
                     help=f"repeatable (default: {' '.join(DEFAULT_PRINCIPALS)})")
    gen.add_argument("--host", action="append", default=None,
                     help="a name or IP the server certificate is for (repeatable; "
                          "default: localhost, 127.0.0.1, ::1 and this host's name)")
    gen.add_argument("--days", type=int, default=CERT_DAYS)
    cert = actions.add_parser("cert", help="a server certificate signed by DIR's CA")
    cert.add_argument("directory", type=Path)
    cert.add_argument("name")
    cert.add_argument("--host", action="append", required=True)
    cert.add_argument("--days", type=int, default=CERT_DAYS)
    for name, text in (("rotate", "a new key and token; old ones stay valid"),
                       ("retire", "drop all but the newest key and token")):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("directory", type=Path)
        sub.add_argument("principal")
    actions.add_parser("hash-password", help="read a password, print its hash")


def run(args: argparse.Namespace) -> int:
    try:
        if args.keys_command == "generate":
            generate(args.directory, args.principal or DEFAULT_PRINCIPALS, args.host, args.days)
            print(f"dyad keys: cluster credentials in {args.directory}")
        elif args.keys_command == "cert":
            cert_path, key_path = issue_certificate(args.directory / "tls", args.name,
                                                    args.host, args.days)
            print(f"dyad keys: {cert_path} and {key_path}")
        elif args.keys_command in ("rotate", "retire"):
            action = rotate if args.keys_command == "rotate" else retire
            action(args.directory, args.principal)
            print(f"dyad keys: {args.keys_command}d {args.principal}; reload the servers "
                  f"that read {args.directory / 'credentials.json'}")
        else:
            password = getpass.getpass("password: ") if sys.stdin.isatty() \
                else sys.stdin.readline().rstrip("\n")
            if not password:
                print("dyad keys: empty password", file=sys.stderr)
                return 2
            print(auth.hash_password(password))
    except (OSError, ValueError, KeyError) as exc:
        print(f"dyad keys: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dyad keys", description=__doc__.split("\n\n")[0])
    _fill_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
