"""ZooKeeper digest credentials and the ACLs of Dyad's znodes.

ZooKeeper lets anyone who reaches it create, change and delete any znode whose
ACL is world-writable, which is the default. With a digest credential
(``user:password``, shared by the cluster's masters and the service framework,
kept in a file such as the ``zookeeper.digest`` that `dyad keys` writes):

- the contender root (``/dyad``) and each contender znode under it are
  *writable by the credential, readable by the world*: Mesos tools and Dyad's
  own detectors find the leader without credentials, but a stranger can neither
  add a contender nor rewrite one;
- everything else Dyad keeps (the registry ``/dyad-registry``, the service
  framework's state) is *the credential's alone*: unreadable and unwritable
  without it.

ZooKeeper checks ACLs per znode, not per path, so reading ``/dyad`` needs no
right on ``/``. This module only builds the values; `dyad.zk` (the one place
that talks to ZooKeeper) passes them to kazoo: `client_options` at
`KazooClient(...)`, `acl_for(root, path)` on every create.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
from kazoo.security import ACL, make_acl, make_digest_acl

_USER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ZkCredentialsError(ValueError):
    """The digest credential is missing or malformed; says where and why."""


@attrs.frozen
class ZkDigest:
    user: str
    password: str = attrs.field(repr=False)


def parse_digest(text: str) -> ZkDigest:
    user, sep, password = text.strip().partition(":")
    if not sep or not _USER.match(user) or not password:
        raise ZkCredentialsError("a ZooKeeper digest credential is 'user:password' "
                                 "(user: letters, digits, _ . -)")
    return ZkDigest(user, password)


def load_digest(path: str | Path) -> ZkDigest:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ZkCredentialsError(f"cannot read the ZooKeeper credential {path}: {exc}") from None
    try:
        return parse_digest(text)
    except ZkCredentialsError as exc:
        raise ZkCredentialsError(f"{path}: {exc}") from None


def private_acl(digest: ZkDigest) -> list[ACL]:
    """All rights for the credential, none for anyone else."""
    return [make_digest_acl(digest.user, digest.password, all=True)]


def leader_acl(digest: ZkDigest) -> list[ACL]:
    """All rights for the credential, read for the world (Mesos' leader detection)."""
    return private_acl(digest) + [make_acl("world", "anyone", read=True)]


def acl_for(root: str, path: str, digest: ZkDigest) -> list[ACL]:
    """The ACL a znode at `path` is created with, for masters contending under `root`."""
    if path == root or path.startswith(root + "/"):
        return leader_acl(digest)
    return private_acl(digest)


def client_options(digest: ZkDigest | None) -> dict[str, Any]:
    """Keyword arguments for `KazooClient`: authenticate the session, and make
    znodes created without an explicit ACL private. None: no authentication."""
    if digest is None:
        return {}
    return {"auth_data": [("digest", f"{digest.user}:{digest.password}")],
            "default_acl": private_acl(digest)}
