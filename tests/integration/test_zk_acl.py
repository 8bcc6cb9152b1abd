"""`dyad.zk_acl` against a real ZooKeeper: with the digest credential a master can
contend and write its registry; without it (or with a wrong one) a stranger can
read who leads but can neither add a contender nor touch the registry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from dyad import zk_acl
from dyad.zk import CONTENDER_PREFIX, leader_child

from .zookeeper import ZooKeeperServer, zookeeper  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

ROOT = "/dyad"
REGISTRY = "/dyad-registry"
DIGEST = zk_acl.parse_digest("dyad:s3cret-digest")


@pytest.fixture
def connect(zookeeper: ZooKeeperServer) -> Iterator[Any]:  # noqa: F811
    clients: list[KazooClient] = []

    def make(digest: zk_acl.ZkDigest | None) -> KazooClient:
        client = KazooClient(hosts=zookeeper.hosts, timeout=10,
                             **zk_acl.client_options(digest))
        client.start(timeout=30)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.stop()
        client.close()


def create(client: KazooClient, path: str, data: bytes = b"", **kwargs: Any) -> str:
    return str(client.create(path, data, acl=zk_acl.acl_for(ROOT, path, DIGEST), **kwargs))


@pytest.fixture
def master(connect: Any) -> KazooClient:
    """A master with the credential: contends and writes the registry."""
    client = connect(DIGEST)
    create(client, ROOT)
    create(client, f"{ROOT}/{CONTENDER_PREFIX}", b'{"id":"m1"}', ephemeral=True,
           sequence=True)
    create(client, REGISTRY, b"registry v1")
    return client


@pytest.mark.parametrize("stranger_digest", [None, zk_acl.parse_digest("dyad:wrong")],
                         ids=["no-credential", "wrong-password"])
def test_a_stranger_reads_the_leader_but_writes_nothing(
        master: KazooClient, connect: Any, stranger_digest: zk_acl.ZkDigest | None) -> None:
    stranger = connect(stranger_digest)
    # Mesos tools (and Dyad's detectors) still find the leader.
    leader = leader_child(stranger.get_children(ROOT))
    assert leader is not None
    assert stranger.get(f"{ROOT}/{leader}")[0] == b'{"id":"m1"}'
    # ... but cannot join the election, rewrite or remove a contender,
    with pytest.raises(NoAuthError):
        stranger.create(f"{ROOT}/{CONTENDER_PREFIX}", b'{"id":"rogue"}', ephemeral=True,
                        sequence=True)
    with pytest.raises(NoAuthError):
        stranger.set(f"{ROOT}/{leader}", b'{"id":"rogue"}')
    with pytest.raises(NoAuthError):
        stranger.delete(f"{ROOT}/{leader}")
    with pytest.raises(NoAuthError):
        stranger.set_acls(ROOT, zk_acl.leader_acl(zk_acl.parse_digest("rogue:x")))
    # ... nor read or rewrite the registry.
    with pytest.raises(NoAuthError):
        stranger.get(REGISTRY)
    with pytest.raises(NoAuthError):
        stranger.set(REGISTRY, b"forged")
    assert master.get(REGISTRY)[0] == b"registry v1"
    assert stranger.get_children(ROOT) == [leader]


def test_another_process_with_the_credential_can_take_over(master: KazooClient,
                                                           connect: Any) -> None:
    """A second master (same credential, another session) contends and writes."""
    standby = connect(DIGEST)
    create(standby, f"{ROOT}/{CONTENDER_PREFIX}", b'{"id":"m2"}', ephemeral=True,
           sequence=True)
    assert len(standby.get_children(ROOT)) == 2
    standby.set(REGISTRY, b"registry v2")
    assert master.get(REGISTRY)[0] == b"registry v2"


def test_znodes_created_without_an_acl_are_private(connect: Any) -> None:
    """`client_options` makes kazoo's default ACL the credential's alone, so a
    znode (or a parent `ensure_path` creates) is never world-writable by mistake."""
    owner = connect(DIGEST)
    owner.ensure_path("/dyad-service/apps")
    stranger = connect(None)
    for path in ("/dyad-service", "/dyad-service/apps"):
        with pytest.raises(NoAuthError):
            stranger.get(path)
        with pytest.raises(NoAuthError):
            stranger.create(f"{path}/x", b"")


async def test_a_master_with_the_digest_keeps_its_znodes_to_itself(
        zookeeper: ZooKeeperServer, connect: Any, tmp_path: Any) -> None:  # noqa: F811
    """The wiring: `dyad-master --zk-digest-file` contends and writes its registry
    with the ACLs above, so a stranger finds the leader (and the CURVE key it
    advertises) but changes nothing."""
    import json

    from dyad import keys_cli
    from dyad.auth import load_credentials, load_keys
    from dyad.security import ServerSecurity
    from dyad.zk import parse_zk_url
    from master.server import MasterServer

    keys = tmp_path / "keys"
    keys_cli.generate(keys, ["master"], hosts=["127.0.0.1"])
    curve = load_keys(keys / "curve" / "master.key_secret")
    address = parse_zk_url(zookeeper.url(ROOT))
    server = MasterServer(port=0, zmq_port=0, zk=address, secure=ServerSecurity(
        credentials=load_credentials(keys / "credentials.json"), curve=curve,
        zk_digest=DIGEST))
    await server.start()
    try:
        await asyncio.wait_for(server.elected(), 30)
        stranger = connect(None)
        [leader] = stranger.get_children(ROOT)
        info = json.loads(stranger.get(f"{ROOT}/{leader}")[0])
        assert info["id"] and info["curve_key"] == curve.public.decode()
        with pytest.raises(NoAuthError):
            stranger.create(f"{ROOT}/{CONTENDER_PREFIX}", b"{}", ephemeral=True, sequence=True)
        with pytest.raises(NoAuthError):
            stranger.set(f"{ROOT}/{leader}", b'{"id":"rogue"}')
        with pytest.raises(NoAuthError):
            stranger.get(address.registry_path)
        with pytest.raises(NoAuthError):
            stranger.set(address.registry_path, b"forged")
        # The liveness records (master/liveness.py) are the masters' own too.
        with pytest.raises(NoAuthError):
            stranger.get_children(address.liveness_path)
        with pytest.raises(NoAuthError):
            stranger.create(f"{address.liveness_path}/forged", b"{}", ephemeral=True)
        assert server.is_leader
    finally:
        await server.stop()
