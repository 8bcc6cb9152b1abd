"""Credentials in one place: who a peer is, for ZeroMQ and for HTTP.

Every Dyad process that accepts connections learns *principals* (short names such
as ``agent`` or ``ops``) from one credentials file; authorization (who may do
what) is a separate question asked later with the principal (`dyad.authz`).

What a *client* carries (its keys, the server keys it trusts, the CA, a token:
`ClientCredentials`, `load_keys`, `curve_client`, `HandshakeWatch`) lives in
`dyad.client_auth`, which executors import without aiohttp; it is re-exported here.

- ZeroMQ: CURVE. Keys are pyzmq certificate files (`create_keys`, `load_keys`).
  A server socket (`curve_server`) hands each handshake to the `ZapAuthenticator`
  of its context, which admits only client keys listed in the credentials and
  tells libzmq the key's principal; libzmq then stamps every frame from that
  connection with it, read back by `frame_principal`. `ZAP_ENFORCE_DOMAIN` is set,
  so a server whose authenticator is not running refuses everyone rather than
  admitting everyone (libzmq's legacy default).
- HTTP: TLS contexts (`server_ssl_context`; clients' in `dyad.client_auth`) and an aiohttp
  middleware (`HttpAuthenticator.middleware`) that authenticates every request
  but the open paths (``/health``) with a bearer token or HTTP basic, puts the
  principal on the request, refuses cross-origin writes, and answers 401 JSON.

The credentials file (JSON, written by `dyad keys`, secrets never stored)::

    {"principals": {
       "agent": {"curve_keys": ["<z85 public key>"], "tokens": ["sha256:<hex>"]},
       "ops":   {"tokens": ["sha256:<hex>"], "password": "pbkdf2_sha256$<n>$<salt>$<hex>"}}}

A principal may list several CURVE keys and tokens, so keys rotate without a flag
day: add the new one, roll it out, drop the old one, reload. One key or token
belongs to one principal only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import ssl
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import attrs
import zmq
import zmq.asyncio
import zmq.auth
from aiohttp import web
from zmq.utils import z85

from dyad import bounded_json

# Re-exported: what clients carry lives in dyad.client_auth (no aiohttp, for
# executors); servers and the CLI keep importing it from here.
from dyad.client_auth import (  # noqa: F401
    DYAD_CA,
    DYAD_CURVE_KEY,
    DYAD_MASTER_KEY,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    ClientCredentials,
    CredentialsError,
    CurveKeys,
    HandshakeWatch,
    bearer_header,
    client_ssl_context,
    client_token,
    curve_client,
    load_keys,
    own_secret,
)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
ZAP_DOMAIN = "dyad"
PRINCIPAL_PROPERTY = "User-Id"
OPEN_PATHS = frozenset({"/health"})
PBKDF2_ITERATIONS = 200_000
_PRINCIPAL = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_Z85_KEY = re.compile(r"^[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_PASSWORD_CACHE = 1024

Refused = Callable[[str, str, str], None]
"""`refused(kind, peer, reason)`: told of every refusal, to count and log it."""


class AuthError(Exception):
    """A request or handshake is refused; `reason` is safe to show the peer."""

    def __init__(self, reason: str, kind: str = "unauthenticated") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def check_principal(name: str) -> str:
    if not isinstance(name, str) or not _PRINCIPAL.match(name):
        raise CredentialsError(f"principal {name!r} must be 1-64 of A-Z a-z 0-9 _ . @ -")
    return name


# ------------------------------------------------------------------ secrets

def new_token() -> str:
    """A fresh bearer token: 32 random bytes, URL-safe text."""
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """How a token is stored. Tokens are random, so an unsalted digest is enough."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def hash_password(password: str, iterations: int = PBKDF2_ITERATIONS) -> str:
    """How a chosen password is stored: salted and slow, since people pick weak ones."""
    salt = secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"pbkdf2_sha256${iterations}${salt}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    scheme, iterations, salt, expected = stored.split("$")
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), int(iterations))
    return scheme == "pbkdf2_sha256" and hmac.compare_digest(digest.hex(), expected)


# -------------------------------------------------------------- credentials

@attrs.frozen
class PrincipalEntry:
    curve_keys: tuple[bytes, ...] = ()
    token_hashes: tuple[str, ...] = ()
    password_hash: str | None = None


@attrs.frozen
class Credentials:
    """Who is known: principal -> CURVE public keys, token hashes, password hash."""

    principals: dict[str, PrincipalEntry] = attrs.field(factory=dict)
    _by_key: dict[bytes, str] = attrs.field(init=False, eq=False, repr=False)
    _by_token: dict[str, str] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_key: dict[bytes, str] = {}
        by_token: dict[str, str] = {}
        for name, entry in self.principals.items():
            check_principal(name)
            for key in entry.curve_keys:
                if by_key.setdefault(key, name) != name:
                    raise CredentialsError(f"CURVE key {key.decode()} is listed for both "
                                           f"{by_key[key]!r} and {name!r}")
            for digest in entry.token_hashes:
                if by_token.setdefault(digest, name) != name:
                    raise CredentialsError(f"a token is listed for both {by_token[digest]!r} "
                                           f"and {name!r}")
        object.__setattr__(self, "_by_key", by_key)
        object.__setattr__(self, "_by_token", by_token)

    def principal_for_key(self, z85_public_key: bytes) -> str | None:
        return self._by_key.get(z85_public_key)

    def principal_for_token(self, token: str) -> str | None:
        return self._by_token.get(hash_token(token))

    def to_json(self) -> dict[str, Any]:
        principals: dict[str, Any] = {}
        for name, entry in sorted(self.principals.items()):
            doc: dict[str, Any] = {}
            if entry.curve_keys:
                doc["curve_keys"] = [key.decode() for key in entry.curve_keys]
            if entry.token_hashes:
                doc["tokens"] = list(entry.token_hashes)
            if entry.password_hash is not None:
                doc["password"] = entry.password_hash
            principals[name] = doc
        return {"principals": principals}


def parse_credentials(doc: Any) -> Credentials:
    """Credentials from their JSON document; `CredentialsError` names the bad part."""
    if not isinstance(doc, dict) or set(doc) != {"principals"} \
            or not isinstance(doc["principals"], dict):
        raise CredentialsError('credentials must be {"principals": {name: {...}}}')
    entries = {}
    for name, body in doc["principals"].items():
        check_principal(name)
        if not isinstance(body, dict) or not set(body) <= {"curve_keys", "tokens", "password"}:
            raise CredentialsError(f"principal {name!r}: expected an object with curve_keys, "
                                   "tokens and/or password")
        keys = _strings(body.get("curve_keys", []), f"{name}.curve_keys")
        for key in keys:
            if not _Z85_KEY.match(key):
                raise CredentialsError(f"{name}.curve_keys: {key!r} is not a Z85 CURVE key")
        tokens = _strings(body.get("tokens", []), f"{name}.tokens")
        for digest in tokens:
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise CredentialsError(f"{name}.tokens: expected 'sha256:<64 hex>'")
        password = body.get("password")
        if password is not None and not (isinstance(password, str) and re.fullmatch(
                r"pbkdf2_sha256\$[1-9][0-9]{0,8}\$[0-9a-f]{8,64}\$[0-9a-f]{64}", password)):
            raise CredentialsError(f"{name}.password: expected a pbkdf2_sha256 hash "
                                   "(dyad keys hash-password)")
        entries[name] = PrincipalEntry(tuple(k.encode() for k in keys), tuple(tokens), password)
    return Credentials(entries)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CredentialsError(f"{where}: expected a list of strings")
    return value


def load_credentials(path: str | os.PathLike[str]) -> Credentials:
    try:
        doc = bounded_json.loads(Path(path).read_bytes())
    except (OSError, bounded_json.JsonInputError) as exc:
        raise CredentialsError(f"cannot read credentials {path}: {exc}") from None
    try:
        return parse_credentials(doc)
    except CredentialsError as exc:
        raise CredentialsError(f"{path}: {exc}") from None


# ------------------------------------------------------------------- CURVE

def create_keys(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write `name.key` (public) and `name.key_secret` (mode 0600); return both paths."""
    public, secret = zmq.auth.create_certificates(os.fspath(directory), name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def curve_server(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make `sock` (before bind) a CURVE server whose handshakes the context's
    `ZapAuthenticator` decides; with none running, every handshake fails."""
    sock.setsockopt(zmq.CURVE_SECRETKEY, own_secret(keys))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def frame_principal(frame: zmq.Frame) -> str | None:
    """The principal ZAP gave this frame's connection (frames received with
    copy=False); None on a socket without authentication."""
    try:
        value = frame.get(PRINCIPAL_PROPERTY)
    except zmq.ZMQError:
        return None
    return value or None


class KeyLookup(Protocol):
    """What ZAP asks: whose is this Z85 public key? `Credentials` answers from the
    file; an agent can answer for the per-run keys it gives its executors."""

    def principal_for_key(self, z85_public_key: bytes) -> str | None: ...


@attrs.frozen
class ZapReply:
    status: bytes
    text: bytes
    principal: str = ""


def zap_decide(frames: list[bytes], credentials: KeyLookup) -> tuple[bytes, ZapReply]:
    """The answer to one ZAP request (RFC 27): (request id, reply). Pure."""
    if len(frames) < 6 or frames[0] != b"1.0":
        return (frames[1] if len(frames) > 1 else b""), ZapReply(b"500", b"malformed ZAP request")
    request_id, domain, mechanism, creds = frames[1], frames[2], frames[5], frames[6:]
    if domain != ZAP_DOMAIN.encode():
        return request_id, ZapReply(b"400", b"unknown ZAP domain")
    if mechanism != b"CURVE" or len(creds) != 1 or len(creds[0]) != 32:
        return request_id, ZapReply(b"400", b"CURVE with a client key is required")
    principal = credentials.principal_for_key(z85.encode(creds[0]))
    if principal is None:
        return request_id, ZapReply(b"400", b"unknown CURVE key")
    return request_id, ZapReply(b"200", b"OK", principal)


class ZapAuthenticator:
    """The ZAP handler of one ZeroMQ context, on the event loop.

    Admits CURVE clients whose public key is in `credentials` and names their
    principal; refusals go to `refused("curve", peer_ip, reason)`. Replace
    `credentials` to rotate keys: it applies to new connections only."""

    def __init__(self, context: zmq.asyncio.Context, credentials: KeyLookup,
                 refused: Refused | None = None) -> None:
        self.context = context
        self.credentials = credentials
        self._refused = refused
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Bind the ZAP endpoint before any server socket binds."""
        sock = self.context.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(ZAP_ENDPOINT)
        self._sock = sock
        self._task = asyncio.ensure_future(self._serve(sock))

    async def _serve(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            request_id, reply = zap_decide(frames, self.credentials)
            if reply.status != b"200" and self._refused is not None:
                peer = frames[3].decode(errors="replace") if len(frames) > 3 else "?"
                self._refused("curve", peer, reply.text.decode())
            await sock.send_multipart([b"1.0", request_id, reply.status, reply.text,
                                       reply.principal.encode(), b""])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._sock = self._task = None


# ---------------------------------------------------------------------- TLS

def server_ssl_context(cert: str | os.PathLike[str], key: str | os.PathLike[str],
                       client_ca: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """TLS for an HTTP server; with `client_ca`, clients must show a certificate it signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(os.fspath(cert), os.fspath(key))
        if client_ca is not None:
            context.load_verify_locations(os.fspath(client_ca))
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"cannot load TLS certificate {cert}: {exc}") from None
    return context


PRINCIPAL_KEY: Any = (web.RequestKey("dyad.principal", str) if hasattr(web, "RequestKey")
                      else "dyad.principal")
"""`request[PRINCIPAL_KEY]`: the principal of an authenticated request (None on open paths)."""


def request_principal(request: web.Request) -> str | None:
    principal = request.get(PRINCIPAL_KEY)
    return principal if isinstance(principal, str) else None


def basic_header(user: str, secret: str) -> dict[str, str]:
    """HTTP basic; `secret` is the user's password or one of its tokens."""
    value = base64.b64encode(f"{user}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {value}"}


class HttpAuthenticator:
    """Authenticates HTTP requests against `credentials` (replace it to rotate).

    Tokens are checked in microseconds. Passwords take a PBKDF2 round, run off
    the event loop one at a time; a good password is remembered (by digest) until
    the credentials change, so a logged-in browser does not pay it per request.
    Wrong passwords are not remembered, and cost their sender the queue only."""

    def __init__(self, credentials: Credentials, refused: Refused | None = None,
                 open_paths: Iterable[str] = OPEN_PATHS) -> None:
        self._credentials = credentials
        self._refused = refused
        self.open_paths = frozenset(open_paths)
        self._good_passwords: dict[bytes, str] = {}
        self._hashing = asyncio.Semaphore(1)

    @property
    def credentials(self) -> Credentials:
        return self._credentials

    @credentials.setter
    def credentials(self, credentials: Credentials) -> None:
        self._credentials = credentials
        self._good_passwords.clear()

    async def authenticate(self, authorization: str | None) -> str:
        """The principal an `Authorization` header proves, or `AuthError`."""
        if not authorization:
            raise AuthError("authentication required (Authorization: Bearer <token>)")
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer":
            principal = self._credentials.principal_for_token(value)
            if principal is None:
                raise AuthError("unknown token")
            return principal
        if scheme == "basic":
            return await self._basic(value)
        raise AuthError(f"unsupported authentication scheme {scheme!r} (use Bearer or Basic)")

    async def _basic(self, value: str) -> str:
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, sep, password = "", "", ""
        if not sep:
            raise AuthError("malformed Basic credentials")
        if self._credentials.principal_for_token(password) == user:
            return user  # basic auth with the principal's token as the password (curl -u)
        entry = self._credentials.principals.get(user)
        if entry is None or entry.password_hash is None:
            raise AuthError("unknown user or wrong password")
        memo = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        if self._good_passwords.get(memo) == user:
            return user
        async with self._hashing:
            good = await asyncio.to_thread(verify_password, password, entry.password_hash)
        if not good:
            raise AuthError("unknown user or wrong password")
        if len(self._good_passwords) >= _PASSWORD_CACHE:
            self._good_passwords.clear()
        self._good_passwords[memo] = user
        return user

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        if request.path in self.open_paths:
            request[PRINCIPAL_KEY] = None
            return await handler(request)
        try:
            _same_origin(request)
            request[PRINCIPAL_KEY] = await self.authenticate(
                request.headers.get("Authorization"))
        except AuthError as exc:
            if self._refused is not None:
                self._refused(f"http_{exc.kind}", request.remote or "?", exc.reason)
            status = 403 if exc.kind == "cross_origin" else 401
            # Basic too, so a browser opening the web UI asks for a login (a
            # principal and its password or token).
            headers = ({"WWW-Authenticate": 'Bearer realm="dyad", Basic realm="dyad"'}
                       if status == 401 else {})
            return web.json_response({"error": exc.reason, "path": request.path},
                                     status=status, headers=headers)
        return await handler(request)


def _same_origin(request: web.Request) -> None:
    """Refuse a write a browser sends from another site: a cached Basic login
    would otherwise authenticate it (cross-site request forgery)."""
    if request.method in _SAFE_METHODS:
        return
    origin = request.headers.get("Origin")
    cross = request.headers.get("Sec-Fetch-Site") == "cross-site"
    if cross or (origin is not None and origin.split("://", 1)[-1] != request.host):
        raise AuthError("cross-origin write refused", kind="cross_origin")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_refusal(host: str, secured: bool, insecure: bool) -> str | None:
    """Why a server must not start binding `host`, or None. Binding beyond
    loopback without credentials hands the cluster to anyone on the network."""
    if secured or insecure or is_loopback(host):
        return None
    return (f"refusing to listen on {host} without credentials: anyone who can reach it "
            "could run tasks and read secrets. Give --credentials (see `dyad keys "
            "generate`), bind 127.0.0.1, or pass --insecure to accept the risk")


class RefusalLog:
    """Log a refusal once per (kind, peer) per `interval` seconds, so a peer
    retrying with a bad key cannot flood the log; counts go to metrics instead."""

    def __init__(self, interval: float = 60.0, capacity: int = 10_000) -> None:
        self.interval = interval
        self.capacity = capacity
        self._last: dict[tuple[str, str], float] = {}

    def should_log(self, kind: str, peer: str, now: float) -> bool:
        key = (kind, peer)
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        if len(self._last) >= self.capacity:
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval}
            if len(self._last) >= self.capacity:
                return False  # a storm of distinct peers: the metrics still count them
        self._last[key] = now
        return True
