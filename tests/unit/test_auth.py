"""`dyad.auth` and `dyad.keys_cli` without sockets: the credentials file, the ZAP
decision, HTTP credential checks, refusal logging, and what `dyad keys` writes."""

from __future__ import annotations

import json
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from zmq.utils import z85

from dyad import auth, keys_cli, zk_acl


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys") / "cluster"
    keys_cli.generate(directory, hosts=["localhost", "127.0.0.1"])
    return directory


def secret(directory: Path, principal: str) -> str:
    return (directory / "tokens" / f"{principal}.token").read_text()


# ------------------------------------------------------------ dyad keys

def test_generate_writes_every_file_with_secrets_private(cluster: Path) -> None:
    for name in keys_cli.DEFAULT_PRINCIPALS:
        assert (cluster / "curve" / f"{name}.key").exists()
        for private in (cluster / "curve" / f"{name}.key_secret",
                        cluster / "tokens" / f"{name}.token"):
            assert stat.S_IMODE(private.stat().st_mode) == 0o600
    for private in ("tls/ca-key.pem", "tls/server-key.pem", "zookeeper.digest"):
        assert stat.S_IMODE((cluster / private).stat().st_mode) == 0o600
    assert stat.S_IMODE((cluster / "curve").stat().st_mode) == 0o700
    assert (cluster / "zookeeper.digest").read_text().startswith("dyad:")
    # No secret ends up in the shared credentials file.
    text = (cluster / "credentials.json").read_text()
    assert secret(cluster, "agent") not in text
    assert auth.load_keys(cluster / "curve" / "agent.key_secret").secret.decode() not in text


def test_generated_credentials_name_each_key_and_token(cluster: Path) -> None:
    credentials = auth.load_credentials(cluster / "credentials.json")
    assert set(credentials.principals) == set(keys_cli.DEFAULT_PRINCIPALS)
    for name in keys_cli.DEFAULT_PRINCIPALS:
        public = auth.load_keys(cluster / "curve" / f"{name}.key").public
        assert credentials.principal_for_key(public) == name
        assert credentials.principal_for_token(secret(cluster, name)) == name


def test_generate_refuses_to_overwrite_a_cluster(cluster: Path) -> None:
    with pytest.raises(FileExistsError, match="rotate"):
        keys_cli.generate(cluster)


def test_rotate_keeps_the_old_key_valid_until_retire(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    keys_cli.generate(directory, ["agent"], hosts=["localhost"])
    old_key = auth.load_keys(directory / "curve" / "agent.key").public
    old_token = secret(directory, "agent")
    rotated = keys_cli.rotate(directory, "agent")
    new_key = auth.load_keys(directory / "curve" / "agent.key").public
    assert new_key != old_key
    assert rotated.principal_for_key(old_key) == rotated.principal_for_key(new_key) == "agent"
    assert rotated.principal_for_token(old_token) == "agent"
    assert auth.load_credentials(directory / "credentials.json") == rotated
    retired = keys_cli.retire(directory, "agent")
    assert retired.principal_for_key(old_key) is None
    assert retired.principal_for_token(old_token) is None
    assert retired.principal_for_key(new_key) == "agent"
    assert not list((directory / "curve").glob("*.old"))


def test_cli_runs_and_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert keys_cli.main(["generate", str(tmp_path / "c"), "--principal", "a",
                          "--host", "localhost"]) == 0
    assert keys_cli.main(["generate", str(tmp_path / "c")]) == 1
    assert "exists" in capsys.readouterr().err
    assert keys_cli.main(["cert", str(tmp_path / "c"), "node1", "--host", "10.0.0.7"]) == 0
    assert (tmp_path / "c" / "tls" / "node1.pem").exists()
    assert keys_cli.main(["retire", str(tmp_path / "c"), "nobody"]) == 1


# ---------------------------------------------------------- credentials

KEY = z85.encode(b"k" * 32).decode()


@pytest.mark.parametrize("doc, reason", [
    ([], "must be"),
    ({"principals": {}, "extra": 1}, "must be"),
    ({"principals": {"bad name": {}}}, "principal"),
    ({"principals": {"a": {"curve_keys": ["short"]}}}, "not a Z85"),
    ({"principals": {"a": {"tokens": ["plain-token"]}}}, "sha256"),
    ({"principals": {"a": {"password": "hunter2"}}}, "pbkdf2"),
    ({"principals": {"a": {"role": "x"}}}, "expected an object"),
    ({"principals": {"a": {"curve_keys": [KEY]}, "b": {"curve_keys": [KEY]}}}, "both"),
    ({"principals": {"a": {"tokens": [auth.hash_token("t")]},
                     "b": {"tokens": [auth.hash_token("t")]}}}, "both"),
])
def test_bad_credentials_are_refused_with_a_reason(doc: object, reason: str) -> None:
    with pytest.raises(auth.CredentialsError, match=reason):
        auth.parse_credentials(doc)


def test_credentials_round_trip_through_json() -> None:
    credentials = auth.Credentials({"ops": auth.PrincipalEntry(
        (KEY.encode(),), (auth.hash_token("t"),), auth.hash_password("pw", iterations=10))})
    assert auth.parse_credentials(json.loads(json.dumps(credentials.to_json()))) == credentials


def test_an_unreadable_credentials_file_says_which(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text("{")
    with pytest.raises(auth.CredentialsError, match="c.json"):
        auth.load_credentials(tmp_path / "c.json")
    with pytest.raises(auth.CredentialsError, match="missing.json"):
        auth.load_credentials(tmp_path / "missing.json")


def test_passwords_are_salted() -> None:
    one, two = auth.hash_password("pw", 10), auth.hash_password("pw", 10)
    assert one != two
    assert auth.verify_password("pw", one) and not auth.verify_password("pW", one)


def test_client_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("from-file\n")
    assert auth.client_token({}) is None
    assert auth.client_token({"DYAD_TOKEN": "direct"}) == "direct"
    assert auth.client_token({"DYAD_TOKEN_FILE": str(tmp_path / "t")}) == "from-file"
    with pytest.raises(auth.CredentialsError):
        auth.client_token({"DYAD_TOKEN_FILE": str(tmp_path / "missing")})


# ------------------------------------------------------------------ ZAP

def zap_request(key: bytes, mechanism: bytes = b"CURVE", domain: bytes = b"dyad") -> list[bytes]:
    return [b"1.0", b"7", domain, b"10.0.0.9", b"identity", mechanism, key]


def test_zap_admits_a_known_key_under_its_principal(cluster: Path) -> None:
    credentials = auth.load_credentials(cluster / "credentials.json")
    public = auth.load_keys(cluster / "curve" / "agent.key").public
    assert auth.zap_decide(zap_request(z85.decode(public)), credentials) == \
        (b"7", auth.ZapReply(b"200", b"OK", "agent"))


@pytest.mark.parametrize("frames, status, text", [
    (zap_request(zmq.curve_keypair()[0][:32]), b"400", b"unknown CURVE key"),
    (zap_request(b"x" * 32, mechanism=b"NULL"), b"400", b"CURVE with a client key"),
    (zap_request(b"x" * 31), b"400", b"CURVE with a client key"),
    (zap_request(b"x" * 32, domain=b"other"), b"400", b"unknown ZAP domain"),
    ([b"2.0", b"7"], b"500", b"malformed"),
    ([], b"500", b"malformed"),
])
def test_zap_refuses_everything_else_with_a_reason(cluster: Path, frames: list[bytes],
                                                   status: bytes, text: bytes) -> None:
    credentials = auth.load_credentials(cluster / "credentials.json")
    _, reply = auth.zap_decide(frames, credentials)
    assert reply.status == status and reply.text.startswith(text) and reply.principal == ""


# ----------------------------------------------------------------- HTTP

@pytest.fixture
def http_auth() -> auth.HttpAuthenticator:
    return auth.HttpAuthenticator(auth.Credentials({
        "ops": auth.PrincipalEntry((), (auth.hash_token("ops-token"),),
                                   auth.hash_password("correct horse", iterations=10)),
        "agent": auth.PrincipalEntry((), (auth.hash_token("agent-token"),)),
    }))


async def test_http_credentials_name_their_principal(http_auth: auth.HttpAuthenticator) -> None:
    def header(value: dict[str, str]) -> str:
        return value["Authorization"]
    assert await http_auth.authenticate("Bearer ops-token") == "ops"
    assert await http_auth.authenticate(header(auth.bearer_header("agent-token"))) == "agent"
    assert await http_auth.authenticate(header(auth.basic_header("ops", "correct horse"))) == "ops"
    assert await http_auth.authenticate(header(auth.basic_header("ops", "ops-token"))) == "ops"


@pytest.mark.parametrize("header, reason", [
    (None, "authentication required"),
    ("", "authentication required"),
    ("Bearer agent-tokenx", "unknown token"),
    ("Token ops-token", "unsupported"),
    ("Basic !!!", "malformed"),
    ("Basic " + "b3Bz", "malformed"),  # "ops" without a colon
])
async def test_http_refusals_say_why(http_auth: auth.HttpAuthenticator, header: str | None,
                                     reason: str) -> None:
    with pytest.raises(auth.AuthError, match=reason):
        await http_auth.authenticate(header)


async def test_a_token_of_one_principal_does_not_log_in_another(
        http_auth: auth.HttpAuthenticator) -> None:
    for user, password in (("ops", "agent-token"), ("agent", "correct horse"),
                           ("nobody", "ops-token"), ("ops", "wrong")):
        with pytest.raises(auth.AuthError, match="unknown user or wrong password"):
            await http_auth.authenticate(auth.basic_header(user, password)["Authorization"])


async def test_a_remembered_password_is_forgotten_when_credentials_change(
        http_auth: auth.HttpAuthenticator) -> None:
    login = auth.basic_header("ops", "correct horse")["Authorization"]
    assert await http_auth.authenticate(login) == "ops"
    http_auth.credentials = auth.Credentials({"ops": auth.PrincipalEntry(
        (), (), auth.hash_password("new password", iterations=10))})
    with pytest.raises(auth.AuthError):
        await http_auth.authenticate(login)


# ------------------------------------------------------------ TLS, logs

def test_tls_contexts_verify_and_name_bad_files(cluster: Path, tmp_path: Path) -> None:
    tls = cluster / "tls"
    client = auth.client_ssl_context(tls / "ca.pem")
    assert client.check_hostname and client.verify_mode.name == "CERT_REQUIRED"
    server = auth.server_ssl_context(tls / "server.pem", tls / "server-key.pem",
                                     client_ca=tls / "ca.pem")
    assert server.verify_mode.name == "CERT_REQUIRED"
    with pytest.raises(auth.CredentialsError, match="missing.pem"):
        auth.server_ssl_context(tmp_path / "missing.pem", tls / "server-key.pem")
    with pytest.raises(auth.CredentialsError, match="cannot load TLS CA"):
        auth.client_ssl_context(tls / "server-key.pem")


def test_refusals_are_logged_once_per_peer_per_interval() -> None:
    log = auth.RefusalLog(interval=60, capacity=2)
    assert log.should_log("curve", "10.0.0.1", 0.0)
    assert not log.should_log("curve", "10.0.0.1", 59.0)
    assert log.should_log("http_unauthenticated", "10.0.0.1", 59.0)
    assert not log.should_log("curve", "10.0.0.2", 59.5)  # full: the metrics still count it
    assert log.should_log("curve", "10.0.0.1", 61.0)
    assert log.should_log("curve", "10.0.0.2", 125.0)


def test_frame_principal_is_none_without_authentication() -> None:
    assert auth.frame_principal(zmq.Frame(struct.pack("!I", 1))) is None


# ------------------------------------------------------------ ZooKeeper

def test_zookeeper_digest_from_the_generated_file(cluster: Path) -> None:
    digest = zk_acl.load_digest(cluster / "zookeeper.digest")
    assert digest.user == "dyad" and len(digest.password) >= 24
    assert digest.password not in repr(digest)
    options = zk_acl.client_options(digest)
    assert options["auth_data"] == [("digest", f"dyad:{digest.password}")]
    assert zk_acl.client_options(None) == {}


@pytest.mark.parametrize("text", ["", "dyad", "dyad:", ":pw", "a b:pw"])
def test_a_malformed_zookeeper_digest_is_refused(text: str, tmp_path: Path) -> None:
    (tmp_path / "digest").write_text(text)
    with pytest.raises(zk_acl.ZkCredentialsError, match="digest"):
        zk_acl.load_digest(tmp_path / "digest")


def test_znodes_under_the_root_are_world_readable_and_the_rest_private() -> None:
    digest = zk_acl.parse_digest("dyad:pw")
    for path in ("/dyad", "/dyad/json.info_0000000001"):
        assert zk_acl.acl_for("/dyad", path, digest) == zk_acl.leader_acl(digest)
    for path in ("/dyad-registry", "/dyadx", "/"):
        assert zk_acl.acl_for("/dyad", path, digest) == zk_acl.private_acl(digest)


# -------------------------------------------------- clients, exposure

def test_client_credentials_from_the_environment(cluster: Path, tmp_path: Path) -> None:
    curve = cluster / "curve"
    env = {"DYAD_CURVE_KEY": str(curve / "agent.key_secret"),
           "DYAD_MASTER_KEY": f"{curve / 'master.key'}:{curve / 'operator.key'}",
           "DYAD_CA": str(cluster / "tls" / "ca.pem"),
           "DYAD_TOKEN_FILE": str(cluster / "tokens" / "agent.token")}
    client = auth.ClientCredentials.from_env(env)
    master = auth.load_keys(curve / "master.key").public
    assert client.keys == auth.load_keys(curve / "agent.key_secret")
    assert client.master_key(None) == master
    assert client.master_key(auth.load_keys(curve / "operator.key").public) != master
    with pytest.raises(auth.CredentialsError, match="not among the keys we trust"):
        client.master_key(auth.load_keys(curve / "batch.key").public)
    assert client.token == secret(cluster, "agent")
    assert auth.ClientCredentials.from_env({}) == auth.ClientCredentials()
    with pytest.raises(auth.CredentialsError, match="needs our own keys"):
        auth.ClientCredentials.from_env({"DYAD_MASTER_KEY": env["DYAD_MASTER_KEY"]})


def test_a_client_pinning_no_master_key_learns_the_advertised_one_but_only_with_the_ca(
        cluster: Path) -> None:
    curve = cluster / "curve"
    own = {"DYAD_CURVE_KEY": str(curve / "agent.key_secret")}
    with pytest.raises(auth.CredentialsError, match="needs \\$DYAD_CA"):
        auth.ClientCredentials.from_env(own)
    client = auth.ClientCredentials.from_env({**own, "DYAD_CA": str(cluster / "tls" / "ca.pem")})
    advertised = auth.load_keys(curve / "master.key").public
    assert client.master_keys == ()
    assert client.master_key(advertised) == advertised
    with pytest.raises(auth.CredentialsError, match="advertises no CURVE key"):
        client.master_key(None)
    for garbage in (b"short", b"~" * 40, advertised[:39] + b"\xff"):
        with pytest.raises(auth.CredentialsError, match="not a CURVE public key"):
            client.master_key(garbage)


def test_client_auth_keeps_executors_free_of_aiohttp() -> None:
    """Executors of a secured cluster import dyad.client_auth: it must not
    bring the server side (aiohttp costs each executor a third of a second)."""
    code = ("import sys, dyad.client_auth, frameworks._security; "
            "print(sorted(m for m in sys.modules if m.startswith(('aiohttp', 'dyad.auth'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("host, secured, insecure, refused", [
    ("127.0.0.1", False, False, False),
    ("localhost", False, False, False),
    ("::1", False, False, False),
    ("0.0.0.0", False, False, True),
    ("10.1.2.3", False, False, True),
    ("master.example", False, False, True),
    ("0.0.0.0", True, False, False),
    ("0.0.0.0", False, True, False),
])
def test_binding_beyond_loopback_needs_credentials_or_insecure(
        host: str, secured: bool, insecure: bool, refused: bool) -> None:
    reason = auth.exposure_refusal(host, secured, insecure)
    assert (reason is not None) == refused
    if reason:
        assert host in reason and "--insecure" in reason
