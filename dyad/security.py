"""A server process's security settings: the flags, the files they name, and
the few things every Dyad server does with them.

Masters, agents and the service framework share the flags (`add_flags`):
``--credentials`` (who is known, `dyad.auth`), ``--acls`` (who may do what,
`dyad.authz`), ``--curve-key`` (this server's CURVE secret key file),
``--tls-cert``/``--tls-key`` (HTTPS), ``--zk-digest-file`` (ZooKeeper digest
authentication, `dyad.zk_acl`) and ``--insecure``. `load` turns them into a
`ServerSecurity`; with no ``--credentials`` it is `ServerSecurity()`, which
secures nothing, exactly as Dyad behaved before security existed.

With credentials, what a server does:

- `protect(app)`: every HTTP route but ``/health`` needs a token or a basic login
  (`dyad.auth.HttpAuthenticator`), and reading (GET) needs `view_state`;
- `Zap`: the ZAP handler that admits known CURVE keys, started before a server
  socket binds, in a ZeroMQ context of the server's own (a ZAP handler belongs
  to one context, and two servers in one process must not share it);
- every refusal is counted (``<prefix>/auth_failures/<kind>``) and logged once
  per peer and kind per minute (`Refusals`).

Without ``--acls`` an authenticated principal may do anything (the binding of
agent and framework ids to the principal that registered them still holds);
with it, what the file does not allow is denied.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import zmq.asyncio
from aiohttp import web

from dyad.auth import (
    ClientCredentials,
    Credentials,
    CredentialsError,
    CurveKeys,
    HandshakeWatch,
    HttpAuthenticator,
    KeyLookup,
    RefusalLog,
    ZapAuthenticator,
    exposure_refusal,
    load_credentials,
    load_keys,
    request_principal,
    server_ssl_context,
)
from dyad.authz import AclError, Acls, Action, loads_acls
from dyad.zk_acl import ZkCredentialsError, ZkDigest, load_digest

log = logging.getLogger(__name__)


class SecurityError(ValueError):
    """The security flags or the files they name cannot be used; says why."""


@attrs.frozen
class ServerSecurity:
    credentials: Credentials | None = None
    acls: Acls = attrs.field(factory=Acls.open)
    curve: CurveKeys | None = None
    tls: ssl.SSLContext | None = None
    zk_digest: ZkDigest | None = None
    # What this server presents when it calls another (the master calling an
    # agent's /drain): its token and the CA, from $DYAD_TOKEN[_FILE] and $DYAD_CA.
    client: ClientCredentials = attrs.field(factory=ClientCredentials)

    @property
    def enabled(self) -> bool:
        return self.credentials is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


def add_flags(parser: argparse.ArgumentParser, zookeeper: bool = True) -> None:
    group = parser.add_argument_group("security (docs/security.md)")
    group.add_argument("--credentials", type=Path, metavar="FILE",
                       help="credentials.json: who may connect (dyad keys generate)")
    group.add_argument("--acls", type=Path, metavar="FILE",
                       help="acls.json: who may do what (default with --credentials: "
                            "any authenticated principal)")
    group.add_argument("--curve-key", type=Path, metavar="FILE",
                       help="this server's CURVE secret key (curve/P.key_secret)")
    group.add_argument("--tls-cert", type=Path, metavar="FILE", help="HTTPS certificate")
    group.add_argument("--tls-key", type=Path, metavar="FILE", help="HTTPS private key")
    if zookeeper:
        group.add_argument("--zk-digest-file", type=Path, metavar="FILE",
                           help="user:password for ZooKeeper digest authentication")
    group.add_argument("--insecure", action="store_true",
                       help="allow listening beyond loopback without --credentials")


def load(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ServerSecurity:
    """The settings the flags name; `SecurityError` says which file or flag is wrong."""
    try:
        digest = load_digest(args.zk_digest_file) \
            if getattr(args, "zk_digest_file", None) else None
        if args.credentials is None:
            for flag in ("acls", "curve_key", "tls_cert"):
                if getattr(args, flag) is not None:
                    raise SecurityError(f"--{flag.replace('_', '-')} needs --credentials")
            return ServerSecurity(zk_digest=digest)
        if (args.tls_cert is None) != (args.tls_key is None):
            raise SecurityError("--tls-cert and --tls-key go together")
        acls = loads_acls(args.acls.read_bytes()) if args.acls is not None \
            else Acls((), permissive=True)
        return ServerSecurity(
            credentials=load_credentials(args.credentials), acls=acls,
            curve=load_keys(args.curve_key) if args.curve_key is not None else None,
            tls=server_ssl_context(args.tls_cert, args.tls_key)
            if args.tls_cert is not None else None,
            zk_digest=digest, client=ClientCredentials.from_env(environ))
    except OSError as exc:
        raise SecurityError(f"cannot read {exc.filename}: {exc.strerror}") from None
    except (CredentialsError, AclError, ZkCredentialsError) as exc:
        raise SecurityError(str(exc)) from None


def for_server(args: argparse.Namespace, host: str,
               environ: dict[str, str] | None = None) -> ServerSecurity:
    """`load`, then refuse (`SecurityError`) to listen on `host` beyond loopback
    without credentials unless ``--insecure``."""
    security = load(args, environ)
    refusal = exposure_refusal(host, security.enabled, bool(getattr(args, "insecure", False)))
    if refusal:
        raise SecurityError(refusal)
    return security


class Refusals:
    """Counts every refusal as ``<prefix>/auth_failures/<kind>`` and logs it at
    most once per (kind, peer) per minute."""

    def __init__(self, prefix: str, logger: logging.Logger | None = None) -> None:
        self.prefix = prefix
        self.counts: Counter[str] = Counter()
        self._log = RefusalLog()
        self._logger = logger or log

    def __call__(self, kind: str, peer: str, reason: str) -> None:
        self.counts[f"{self.prefix}/auth_failures/{kind}"] += 1
        if self._log.should_log(kind, peer, time.monotonic()):
            self._logger.warning("refused %s from %s: %s (logged once a minute per peer)",
                                 kind, peer, reason)


class Zap:
    """A ZeroMQ context of a CURVE server's own, with its ZAP handler running."""

    def __init__(self, lookup: KeyLookup, refusals: Refusals) -> None:
        self.context = zmq.asyncio.Context()
        self.authenticator = ZapAuthenticator(self.context, lookup, refusals)
        self.authenticator.start()
        self._refusals = refusals
        self._watches: list[HandshakeWatch] = []

    def watch(self, sock: zmq.asyncio.Socket) -> None:
        """Count the handshakes on `sock` that fail before ZAP is asked (``handshake``)."""
        self._watches.append(HandshakeWatch(sock, self._handshake_failed,
                                            HandshakeWatch.SERVER_EVENTS))

    def _handshake_failed(self, endpoint: str, reason: str) -> None:
        self._refusals("handshake", endpoint, "a CURVE handshake failed: a client without "
                                              "CURVE, or one that does not know our key")

    async def stop(self) -> None:
        """After the server socket is closed."""
        for watch in self._watches:
            await watch.stop()
        await self.authenticator.stop()
        self.context.destroy(linger=0)


CLIENT = web.AppKey("dyad.client", ClientCredentials)
"""`app[CLIENT]`: what the server presents when its handlers call other servers."""

Authorize = Callable[[web.Request, str | None], Awaitable[str | None]]
"""`authorize(request, principal)`: a reason to refuse the request (403), or None."""


def protect(app: web.Application, security: ServerSecurity, refusals: Refusals,
            authorize: Authorize | None = None) -> None:
    """Authenticate every request to `app` but ``/health``; then `authorize`
    (default: GETs need `view_state`). Call before the app starts."""
    app[CLIENT] = security.client
    if security.credentials is None:
        return
    authenticator = HttpAuthenticator(security.credentials, refusals)
    check = authorize or _view_state(security.acls)

    @web.middleware
    async def authorized(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        if request.path not in authenticator.open_paths:
            reason = await check(request, request_principal(request))
            if reason is not None:
                refusals("forbidden", request.remote or "?", reason)
                return web.json_response({"error": reason, "path": request.path}, status=403)
        return await handler(request)

    app.middlewares.insert(0, authorized)
    app.middlewares.insert(0, authenticator.middleware)


def _view_state(acls: Acls) -> Authorize:
    async def check(request: web.Request, principal: str | None) -> str | None:
        if request.method not in ("GET", "HEAD"):
            return None  # writes are authorized by what they do, further in
        decision = acls.authorize(principal, Action.VIEW_STATE)
        return None if decision else decision.reason
    return check


def client_session_options(client: ClientCredentials) -> dict[str, Any]:
    """Keyword arguments for an `aiohttp.ClientSession` calling a Dyad server:
    the token and, with a CA, a connector trusting only it."""
    import aiohttp

    context = client.ssl_context()
    options: dict[str, Any] = {"headers": client.headers()}
    if context is not None:
        options["connector"] = aiohttp.TCPConnector(ssl=context)
    return options
