"""`dyad.auth` on real sockets: CURVE through a real ZAP handler, TLS with real
certificates, and the aiohttp middleware behind a real TLS server on loopback."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import zmq
import zmq.asyncio
from aiohttp import web

from dyad import auth, keys_cli
from tests.helpers import wait_for

DEADLINE = 5.0


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys") / "cluster"
    keys_cli.generate(directory, ["master", "agent", "operator"],
                      hosts=["localhost", "127.0.0.1"])
    return directory


@pytest.fixture(scope="module")
def stranger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another cluster's credentials: valid keys and a CA this cluster never trusted."""
    directory = tmp_path_factory.mktemp("keys") / "stranger"
    keys_cli.generate(directory, ["agent"], hosts=["localhost", "127.0.0.1"])
    return directory


def keys(directory: Path, principal: str) -> auth.CurveKeys:
    return auth.load_keys(directory / "curve" / f"{principal}.key_secret")


def token(directory: Path, principal: str) -> str:
    return (directory / "tokens" / f"{principal}.token").read_text()


# ------------------------------------------------------------------ CURVE

class CurveServer:
    """A ROUTER with CURVE and a running `ZapAuthenticator`, in its own context."""

    def __init__(self, directory: Path, authenticate: bool = True) -> None:
        self.context = zmq.asyncio.Context()
        self.refusals: list[tuple[str, str, str]] = []
        self.zap = auth.ZapAuthenticator(
            self.context, auth.load_credentials(directory / "credentials.json"),
            refused=lambda *refusal: self.refusals.append(refusal))
        if authenticate:
            self.zap.start()
        self.keys = keys(directory, "master")
        self.router = self.context.socket(zmq.ROUTER)
        self.sockets = [self.router]
        self.router.setsockopt(zmq.LINGER, 0)
        auth.curve_server(self.router, self.keys)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")

    def client(self, client_keys: auth.CurveKeys | None,
               server_public: bytes | None = None) -> zmq.asyncio.Socket:
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        self.sockets.append(dealer)
        if client_keys is not None:
            auth.curve_client(dealer, client_keys, server_public or self.keys.public)
        dealer.connect(f"tcp://127.0.0.1:{self.port}")
        return dealer

    async def recv(self, timeout: float = DEADLINE) -> tuple[bytes, bytes, str | None]:
        identity, frame = await asyncio.wait_for(
            self.router.recv_multipart(copy=False), timeout)
        return identity.bytes, frame.bytes, auth.frame_principal(frame)

    async def close(self) -> None:
        await self.zap.stop()
        for sock in self.sockets:
            sock.close(linger=0)
        self.context.term()


@pytest.fixture
async def curve(cluster_dir: Path) -> AsyncIterator[CurveServer]:
    server = CurveServer(cluster_dir)
    yield server
    await server.close()


async def test_a_known_key_is_admitted_and_each_frame_carries_its_principal(
        curve: CurveServer, cluster_dir: Path) -> None:
    agent = curve.client(keys(cluster_dir, "agent"))
    operator = curve.client(keys(cluster_dir, "operator"))
    await agent.send(b"from agent")
    await operator.send(b"from operator")
    seen = {(await curve.recv())[1:] for _ in range(2)}
    assert seen == {(b"from agent", "agent"), (b"from operator", "operator")}
    assert curve.refusals == []


async def test_an_unknown_key_is_refused_with_a_reason_and_nothing_arrives(
        curve: CurveServer, cluster_dir: Path, stranger_dir: Path) -> None:
    rogue = curve.client(keys(stranger_dir, "agent"))
    await rogue.send(b"let me in")
    honest = curve.client(keys(cluster_dir, "agent"))
    await honest.send(b"hello")
    # The honest peer's frame arrives; the rogue's never does.
    assert (await curve.recv())[1:] == (b"hello", "agent")
    with pytest.raises(asyncio.TimeoutError):
        await curve.recv(timeout=0.5)
    assert ("curve", "127.0.0.1", "unknown CURVE key") in curve.refusals


async def test_a_plain_client_never_gets_through(curve: CurveServer) -> None:
    plain = curve.client(None)
    await plain.send(b"no keys at all")
    with pytest.raises(asyncio.TimeoutError):
        await curve.recv(timeout=0.5)


async def test_a_client_refuses_a_server_with_another_key(
        curve: CurveServer, cluster_dir: Path, stranger_dir: Path) -> None:
    """A client that expects another server key (an impostor master) sends nothing."""
    misled = curve.client(keys(cluster_dir, "agent"), server_public=keys(stranger_dir,
                                                                          "agent").public)
    await misled.send(b"secret for the real master only")
    with pytest.raises(asyncio.TimeoutError):
        await curve.recv(timeout=0.5)


async def test_a_dealer_told_the_right_server_key_later_reconnects_with_it(
        curve: CurveServer, cluster_dir: Path, stranger_dir: Path) -> None:
    """How a client that learns the master's key from its MasterInfo connects:
    no key, no connection; a wrong key sends nothing; the right one, set on the
    same endpoint, connects again and gets through."""
    from dyad.messages import Ping
    from dyad.transport import Dealer

    dealer = Dealer(context=curve.context, curve=keys(cluster_dir, "agent"))
    curve.sockets.append(dealer.socket)
    endpoint = f"tcp://127.0.0.1:{curve.port}"
    with pytest.raises(ValueError, match="server's public key"):
        dealer.connect(endpoint)
    dealer.set_server_key(keys(stranger_dir, "agent").public)
    dealer.connect(endpoint)
    await dealer.send(Ping(agent_id="S1"))
    with pytest.raises(asyncio.TimeoutError):
        await curve.recv(timeout=0.5)
    dealer.set_server_key(curve.keys.public)
    await dealer.send(Ping(agent_id="S1"))
    _, frame, principal = await curve.recv()
    assert principal == "agent" and b"ping" in frame.lower()


async def test_without_a_running_authenticator_everyone_is_refused(cluster_dir: Path) -> None:
    """ZAP_ENFORCE_DOMAIN: a server that forgot its authenticator admits nobody,
    instead of libzmq's legacy default of admitting every CURVE client."""
    server = CurveServer(cluster_dir, authenticate=False)
    try:
        client = server.client(keys(cluster_dir, "agent"))
        await client.send(b"hello")
        with pytest.raises(asyncio.TimeoutError):
            await server.recv(timeout=0.5)
    finally:
        await server.close()


async def test_rotated_credentials_apply_to_new_connections(
        curve: CurveServer, stranger_dir: Path) -> None:
    curve.zap.credentials = auth.load_credentials(stranger_dir / "credentials.json")
    newcomer = curve.client(keys(stranger_dir, "agent"))
    await newcomer.send(b"new key")
    assert (await curve.recv())[1:] == (b"new key", "agent")


async def test_a_refused_client_is_told_why(curve: CurveServer, cluster_dir: Path,
                                           stranger_dir: Path) -> None:
    reasons: list[str] = []
    rogue = curve.client(keys(stranger_dir, "agent"))
    watch = auth.HandshakeWatch(rogue, lambda endpoint, reason: reasons.append(reason))
    misled = curve.client(keys(cluster_dir, "agent"),
                          server_public=keys(stranger_dir, "agent").public)
    misled_watch = auth.HandshakeWatch(misled, lambda endpoint, reason: reasons.append(reason))
    try:
        await wait_for(lambda: len(set(reasons)) >= 2, DEADLINE, "both refusals")
    finally:
        await watch.stop()
        await misled_watch.stop()
    assert "the server refused our key (ZAP status 400)" in reasons
    assert any("not the one we trust" in reason for reason in reasons)


async def test_a_key_lookup_of_ones_own_admits_per_run_keys(cluster_dir: Path) -> None:
    """How an agent admits its executors: a key made for one run names that run."""
    public, secret = zmq.curve_keypair()
    runs = {public: "executor:fw-1/ex-1/run-1"}

    class Runs:
        def principal_for_key(self, z85_public_key: bytes) -> str | None:
            return runs.get(z85_public_key)

    server = CurveServer(cluster_dir, authenticate=False)
    server.zap.credentials = Runs()
    server.zap.start()
    try:
        executor = server.client(auth.CurveKeys(public, secret))
        await executor.send(b"register")
        assert (await server.recv())[1:] == (b"register", "executor:fw-1/ex-1/run-1")
    finally:
        await server.close()


# -------------------------------------------------------------------- TLS

async def _hello(request: web.Request) -> web.Response:
    return web.json_response({"principal": auth.request_principal(request)})


@pytest.fixture
async def https(cluster_dir: Path) -> AsyncIterator[tuple[str, list[tuple[str, str, str]]]]:
    refusals: list[tuple[str, str, str]] = []
    authenticator = auth.HttpAuthenticator(
        auth.load_credentials(cluster_dir / "credentials.json"),
        refused=lambda *refusal: refusals.append(refusal))
    app = web.Application(middlewares=[authenticator.middleware])
    for path in ("/health", "/state"):
        app.router.add_get(path, _hello)
    app.router.add_post("/tasks/kill", _hello)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = cluster_dir / "tls"
    site = web.TCPSite(runner, "127.0.0.1", 0,
                       ssl_context=auth.server_ssl_context(tls / "server.pem",
                                                           tls / "server-key.pem"))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://localhost:{port}", refusals
    await runner.cleanup()


def client_session(ca_dir: Path) -> aiohttp.ClientSession:
    context = auth.client_ssl_context(ca_dir / "tls" / "ca.pem")
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                 timeout=aiohttp.ClientTimeout(total=DEADLINE))


async def test_a_client_with_the_cluster_ca_gets_in_with_a_token(
        https: tuple[str, list[tuple[str, str, str]]], cluster_dir: Path) -> None:
    url, refusals = https
    async with client_session(cluster_dir) as session:
        async with session.get(f"{url}/state",
                               headers=auth.bearer_header(token(cluster_dir, "operator"))) as r:
            assert r.status == 200
            assert await r.json() == {"principal": "operator"}
        basic = auth.basic_header("agent", token(cluster_dir, "agent"))
        async with session.get(f"{url}/state", headers=basic) as r:
            assert await r.json() == {"principal": "agent"}
    assert refusals == []


async def test_a_client_refuses_a_server_certificate_from_another_ca(
        https: tuple[str, list[tuple[str, str, str]]], stranger_dir: Path) -> None:
    url, _ = https
    async with client_session(stranger_dir) as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError) as caught:
            await session.get(f"{url}/health")
    assert isinstance(caught.value.certificate_error, ssl.SSLCertVerificationError)


async def test_a_client_refuses_a_certificate_for_another_name(
        https: tuple[str, list[tuple[str, str, str]]], cluster_dir: Path) -> None:
    """The certificate names localhost and 127.0.0.1; a client that wants
    master.example (the name it was told) must not accept it."""
    url, _ = https
    async with client_session(cluster_dir) as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"{url}/health", server_hostname="master.example")


@pytest.mark.parametrize("headers, reason", [
    ({}, "authentication required"),
    ({"Authorization": "Bearer not-a-token"}, "unknown token"),
    ({"Authorization": "Basic bm90OmJhc2U2NA=="}, "unknown user or wrong password"),
    ({"Authorization": "Negotiate abc"}, "unsupported authentication scheme"),
])
async def test_a_missing_or_wrong_credential_gets_401_json_and_is_counted(
        https: tuple[str, list[tuple[str, str, str]]], cluster_dir: Path,
        headers: dict[str, str], reason: str) -> None:
    url, refusals = https
    async with client_session(cluster_dir) as session, \
            session.get(f"{url}/state", headers=headers) as r:
        assert r.status == 401
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        body = json.loads(await r.text())
    assert reason in body["error"] and body["path"] == "/state"
    assert len(refusals) == 1 and refusals[0][0] == "http_unauthenticated"


async def test_health_is_open(https: tuple[str, list[tuple[str, str, str]]],
                              cluster_dir: Path) -> None:
    url, refusals = https
    async with client_session(cluster_dir) as session, session.get(f"{url}/health") as r:
        assert r.status == 200
        assert await r.json() == {"principal": None}
    assert refusals == []


async def test_a_cross_site_write_is_refused_even_with_credentials(
        https: tuple[str, list[tuple[str, str, str]]], cluster_dir: Path) -> None:
    url, refusals = https
    basic = auth.basic_header("operator", token(cluster_dir, "operator"))
    async with client_session(cluster_dir) as session:
        cross_site = {**basic, "Origin": "https://evil.example", "Content-Type": "text/plain"}
        async with session.post(f"{url}/tasks/kill", data="task_id=x",
                                headers=cross_site) as r:
            assert r.status == 403
            assert (await r.json())["error"] == "cross-origin write refused"
        same_site = {**basic, "Origin": url, "Content-Type": "application/json"}
        async with session.post(f"{url}/tasks/kill", data="{}", headers=same_site) as r:
            assert r.status == 200
    assert [kind for kind, _, _ in refusals] == ["http_cross_origin"]
