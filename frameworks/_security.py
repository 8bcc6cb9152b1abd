"""How a driver finds and uses its credentials (docs/security.md).

A scheduler driver reads them from ``$DYAD_CURVE_KEY`` (its secret key file),
``$DYAD_MASTER_KEY`` (the master public keys it trusts), ``$DYAD_CA`` and
``$DYAD_TOKEN``/``$DYAD_TOKEN_FILE``; an executor driver gets the same variables
from its agent, naming the key pair of its run and the agent's public key.
`dyad.client_auth` is imported only when one of them is set, and never
`dyad.auth`: an executor pays neither for security it does not use nor for
the server side (aiohttp) it never needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dyad.transport import Dealer

if TYPE_CHECKING:
    from dyad.client_auth import ClientCredentials

VARIABLES = ("DYAD_CURVE_KEY", "DYAD_MASTER_KEY", "DYAD_CA", "DYAD_TOKEN", "DYAD_TOKEN_FILE")


def client_from_env(environ: Mapping[str, str]) -> ClientCredentials | None:
    """The credentials the variables name, or None when none is set.
    Raises `dyad.client_auth.CredentialsError` for a file that cannot be used."""
    if not any(environ.get(name) for name in VARIABLES):
        return None
    from dyad.client_auth import ClientCredentials
    return ClientCredentials.from_env(dict(environ))


class SecureDealer:
    """A Dealer speaking CURVE when `credentials` have keys, telling
    `refused(reason)` (once per distinct reason) why handshakes fail.
    A scheduler driver connects with `connect_master`, which takes the key
    the master advertises when the credentials trust it."""

    def __init__(self, credentials: ClientCredentials | None,
                 refused: Callable[[str], None]) -> None:
        self._refused = refused
        self._said: set[str] = set()
        self._watch: Any = None
        self._credentials = credentials
        if credentials is None or credentials.keys is None:
            self.dealer = Dealer()
            return
        from dyad.client_auth import HandshakeWatch
        pinned = credentials.master_keys[0] if credentials.master_keys else None
        self.dealer = Dealer(curve=credentials.keys, server_key=pinned)
        self._watch = HandshakeWatch(self.dealer.socket, self._failed)

    def connect_master(self, endpoint: str, advertised_key: str) -> bool:
        """Connect to a master at `endpoint` advertising `advertised_key` (its
        MasterInfo's, "" for none); False (and `refused` told why) if we must
        not trust it."""
        if self._credentials is not None and self.dealer.curve:
            from dyad.client_auth import CredentialsError
            try:
                key = self._credentials.master_key(advertised_key.encode() or None)
            except CredentialsError as exc:
                self._refused(f"{endpoint}: {exc}")
                return False
            self.dealer.set_server_key(key)
        self.dealer.connect(endpoint)
        return True

    def _failed(self, endpoint: str, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            self._refused(f"{endpoint}: {reason}")

    async def close(self, linger_ms: int) -> None:
        if self._watch is not None:
            await self._watch.stop()
        self.dealer.close(linger_ms)
