"""What a client carries to prove itself and to know its server: its CURVE
keys, the server keys it trusts, the CA for HTTPS and a token.

Split from `dyad.auth` (the server side: credentials files, ZAP, HTTP
authentication) because every executor of a secured cluster imports this, and
`dyad.auth` brings aiohttp: a third of a second of CPU per task launched on a
loaded machine. Keep it free of aiohttp; `ssl` and `urllib` are imported when a
client first speaks HTTPS.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import zmq
import zmq.asyncio
import zmq.auth
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

if TYPE_CHECKING:
    import ssl
    import urllib.request

TOKEN_ENV = "DYAD_TOKEN"
TOKEN_FILE_ENV = "DYAD_TOKEN_FILE"
DYAD_CURVE_KEY = "DYAD_CURVE_KEY"
DYAD_MASTER_KEY = "DYAD_MASTER_KEY"
DYAD_CA = "DYAD_CA"


class CredentialsError(ValueError):
    """A credentials, key or certificate file cannot be used; says which and why."""


def _is_z85_key(text: bytes) -> bool:
    try:
        return len(text) == 40 and len(z85.decode(text)) == 32
    except (ValueError, KeyError, IndexError):
        return False


@attrs.frozen
class CurveKeys:
    """A CURVE key pair in Z85; `secret` is None for a peer's public certificate."""

    public: bytes
    secret: bytes | None = attrs.field(default=None, repr=False)


def load_keys(path: str | os.PathLike[str]) -> CurveKeys:
    try:
        public, secret = zmq.auth.load_certificate(os.fspath(path))
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"cannot load CURVE keys {path}: {exc}") from None
    return CurveKeys(public, secret)


def own_secret(keys: CurveKeys) -> bytes:
    if keys.secret is None:
        raise CredentialsError("a socket needs its own secret key (the .key_secret file)")
    return keys.secret


def curve_client(sock: zmq.Socket[Any], keys: CurveKeys, server_public: bytes | None) -> None:
    """Make `sock` (before connect) a CURVE client that trusts only `server_public`
    (None: set ``CURVE_SERVERKEY`` before connecting)."""
    sock.setsockopt(zmq.CURVE_SECRETKEY, own_secret(keys))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    if server_public is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)


class HandshakeWatch:
    """Tell a CURVE client why its handshakes fail; ZeroMQ itself only retries.

    `refused(endpoint, reason)` is called on each failed handshake: the server
    refused our key (ZAP said 400), or the handshake broke, which for a CURVE
    client almost always means the server is not the one whose key we trust."""

    CLIENT_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
    # On a server, ZAP refusals are told by the ZAP handler; these are the rest
    # (a client without CURVE, or one that does not know the server's key).
    SERVER_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL

    def __init__(self, sock: zmq.asyncio.Socket, refused: Callable[[str, str], None],
                 events: int = CLIENT_EVENTS) -> None:
        self._monitor = sock.get_monitor_socket(events)
        self._sock = sock
        self._refused = refused
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            event = await recv_monitor_message(self._monitor)
            endpoint = event["endpoint"].decode(errors="replace")
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refused(endpoint, f"the server refused our key (ZAP status "
                                        f"{int(event['value'])})")
            else:
                self._refused(endpoint, "CURVE handshake failed: the server's key is not "
                                        "the one we trust, or it does not speak CURVE")

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if not self._sock.closed:
            self._sock.disable_monitor()
        self._monitor.close(linger=0)


def client_token(environ: dict[str, str] | None = None) -> str | None:
    """The token a CLI or driver presents: $DYAD_TOKEN, else the file $DYAD_TOKEN_FILE."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV):
        return env[TOKEN_ENV].strip()
    if env.get(TOKEN_FILE_ENV):
        try:
            return Path(env[TOKEN_FILE_ENV]).read_text().strip()
        except OSError as exc:
            raise CredentialsError(f"cannot read the token file: {exc}") from None
    return None


def bearer_header(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def client_ssl_context(ca: str | os.PathLike[str], cert: str | os.PathLike[str] | None = None,
                       key: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """TLS for an HTTP client that trusts only servers `ca` signed, for their names."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(os.fspath(ca))
        if cert is not None:
            context.load_cert_chain(os.fspath(cert), None if key is None else os.fspath(key))
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"cannot load TLS CA {ca}: {exc}") from None
    return context


@attrs.frozen
class ClientCredentials:
    """What a client of the master carries (agent, scheduler driver, CLI): its
    own CURVE keys, the master public keys it trusts, the CA for HTTPS, a token.

    With CURVE keys but no master keys, the client *learns* the master's key
    from the MasterInfo it detects (`master_key`); it then needs the CA, so a
    MasterInfo read over HTTP comes from a verified master. Pinned master keys
    win: an advertised key that is not among them is refused."""

    keys: CurveKeys | None = None
    master_keys: tuple[bytes, ...] = ()
    ca: Path | None = None
    token: str | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientCredentials:
        """$DYAD_CURVE_KEY (our .key_secret file), $DYAD_MASTER_KEY (the master's
        .key files, ':'-separated during a rotation), $DYAD_CA, and the token of
        `client_token`. Unset variables leave the part out."""
        env = os.environ if environ is None else environ
        keys = load_keys(env[DYAD_CURVE_KEY]) if env.get(DYAD_CURVE_KEY) else None
        masters = tuple(load_keys(path).public
                        for path in env.get(DYAD_MASTER_KEY, "").split(os.pathsep) if path)
        ca = Path(env[DYAD_CA]) if env.get(DYAD_CA) else None
        if keys is None and masters:
            raise CredentialsError(f"${DYAD_MASTER_KEY} needs our own keys (${DYAD_CURVE_KEY})")
        if keys is not None and not masters and ca is None:
            raise CredentialsError(
                f"CURVE without ${DYAD_MASTER_KEY} learns the master's key from its "
                f"MasterInfo, which needs ${DYAD_CA} to verify it came from the master")
        return cls(keys, masters, ca, client_token(env))

    @property
    def curve(self) -> bool:
        return self.keys is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS trusting only the cluster CA, or None when no CA is given."""
        return client_ssl_context(self.ca) if self.ca is not None else None

    def headers(self) -> dict[str, str]:
        return bearer_header(self.token) if self.token else {}

    def base_url(self, address: str) -> str:
        """'host:port' -> https://host:port with a CA (the servers speak TLS),
        else http://; an address with a scheme is kept as it is."""
        address = address.strip().rstrip("/")
        if address.startswith(("http://", "https://")):
            return address
        return f"{'https' if self.ca is not None else 'http'}://{address}"

    def urlopen(self, request: urllib.request.Request | str, timeout: float) -> Any:
        """`urllib.request.urlopen` with our token and, with a CA, TLS trusting
        only it (for the CLI and other blocking clients)."""
        import urllib.request

        if isinstance(request, str):
            request = urllib.request.Request(request)
        for name, value in self.headers().items():
            request.add_header(name, value)
        return urllib.request.urlopen(request, timeout=timeout, context=self.ssl_context())

    def master_key(self, advertised: bytes | None) -> bytes:
        """The master key to connect with: the one the master advertises (in its
        MasterInfo) if we pin it or pin none, else the first we pin. With pinned
        keys, refuse any other advertised key: the MasterInfo may have been
        tampered with, and the pinned file is the stronger trust."""
        if not self.master_keys:
            if not advertised:
                raise CredentialsError(f"the master advertises no CURVE key and we pin none "
                                       f"(${DYAD_MASTER_KEY})")
            if not _is_z85_key(advertised):
                raise CredentialsError(f"the master advertises {advertised[:60]!r}, "
                                       "which is not a CURVE public key")
            return advertised
        if not advertised:
            return self.master_keys[0]
        if advertised not in self.master_keys:
            raise CredentialsError(f"the master advertises CURVE key {advertised.decode()}, "
                                   "which is not among the keys we trust")
        return advertised
