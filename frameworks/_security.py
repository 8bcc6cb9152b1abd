"""How a driver finds and uses its credentials (docs/security.md).

A scheduler driver reads them from ``$DYAD_CURVE_KEY`` (its secret key file),
``$DYAD_MASTER_KEY`` (the master public keys it trusts), ``$DYAD_CA`` and
``$DYAD_TOKEN``/``$DYAD_TOKEN_FILE``; an executor driver gets the same variables
from its agent, naming the key pair of its run and the agent's public key.
`dyad.auth` is imported only when one of them is set: executors of a cluster
without security start without paying for its imports (aiohttp among them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dyad.transport import Dealer

if TYPE_CHECKING:
    from dyad.auth import ClientCredentials

VARIABLES = ("DYAD_CURVE_KEY", "DYAD_MASTER_KEY", "DYAD_CA", "DYAD_TOKEN", "DYAD_TOKEN_FILE")


def client_from_env(environ: Mapping[str, str]) -> ClientCredentials | None:
    """The credentials the variables name, or None when none is set.
    Raises `dyad.auth.CredentialsError` for a file that cannot be used."""
    if not any(environ.get(name) for name in VARIABLES):
        return None
    from dyad.auth import ClientCredentials
    return ClientCredentials.from_env(dict(environ))


class SecureDealer:
    """A Dealer speaking CURVE when `credentials` have keys, telling
    `refused(reason)` (once per distinct reason) why handshakes fail."""

    def __init__(self, credentials: ClientCredentials | None,
                 refused: Callable[[str], None]) -> None:
        self._refused = refused
        self._said: set[str] = set()
        self._watch: Any = None
        if credentials is None or credentials.keys is None:
            self.dealer = Dealer()
            return
        from dyad.auth import HandshakeWatch
        self.dealer = Dealer(curve=credentials.keys, server_key=credentials.master_key(None))
        self._watch = HandshakeWatch(self.dealer.socket, self._failed)

    def _failed(self, endpoint: str, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            self._refused(f"{endpoint}: {reason}")

    async def close(self, linger_ms: int) -> None:
        if self._watch is not None:
            await self._watch.stop()
        self.dealer.close(linger_ms)
