"""A secured learner: a shared token in call metadata, TLS with client certificates.

Real processes on loopback; certificates are made by the openssl command line
for each test run. An actor that lacks the token (or the client certificate)
is refused with a clear error, and nothing of it reaches the learner or replay.
"""

import subprocess

import grpc
import pytest
from helpers import ENV, rlfleet, start_replay_and_learner, wait_for

from rlfleet.deploy.status import StatusError, get_status
from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
from rlfleet.proto.security import ClientSecurity

pytestmark = pytest.mark.slow

DQN = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("certs")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=rlfleet test CA", cwd=d
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    return d


def _start(procs, tmp_path, free_port, *learner_security):
    return start_replay_and_learner(procs, free_port, DQN, tmp_path / "run", *learner_security)


def _inserts(st):
    return sum(t["inserts"] for t in st["replay"])


def test_token_required(procs, tmp_path, free_port):
    replay, learner, address = _start(procs, tmp_path, free_port, "--token", "s3cret")
    good = ClientSecurity(token="s3cret")
    wait_for(lambda: rlfleet("health", "--learner", address).returncode == 0, 180, "the learner", [replay, learner])

    for bad in ((), ("--token", "wrong")):
        out = rlfleet("actor", "--learner", address, *bad, timeout=120)
        assert out.returncode == 2
        assert "refused this actor" in out.stderr and "token" in out.stderr and "RLFLEET_TOKEN" in out.stderr
    with pytest.raises(StatusError, match="refused the call"):
        get_status(address, 5, ClientSecurity(token="wrong"))
    st = get_status(address, 5, good)
    assert st["actors"] == [] and _inserts(st) == 0, "a refused actor reached the learner or replay"
    # The streaming methods are refused too, each in its own kind of call.
    with grpc.insecure_channel(address) as ch:
        stub = rlfleet_pb2_grpc.LearnerStub(ch)
        for call in (
            lambda: next(stub.StreamWeights(rlfleet_pb2.StreamWeightsRequest(actor_id=0), timeout=10)),
            lambda: next(stub.Heartbeats(iter([rlfleet_pb2.HeartbeatRequest(actor_id=0, env_steps=99)]), timeout=10)),
        ):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "token" in e.value.details()

    # The right token from the environment ($RLFLEET_TOKEN), as docker-compose passes it.
    with_token = dict(ENV, RLFLEET_TOKEN="s3cret")
    actor = procs.start("actor", "actor", "--learner", address, env=with_token)
    st = wait_for(
        lambda: (s := get_status(address, 5, good)) and s["actors"] and _inserts(s) > 0 and s,
        120,
        "the actor with the token to join",
        [learner, actor],
    )
    assert st["actors"][0]["address"] == "127.0.0.1"
    # Its heartbeats (on the Heartbeats stream, with the token) are counted.
    wait_for(lambda: get_status(address, 5, good)["actors"][0]["env_steps"] > 0, 60, "heartbeats", [learner, actor])
    # `status` takes the token from $RLFLEET_TOKEN too.
    assert rlfleet("status", "--learner", address, "--json", env=with_token).returncode == 0
    # Or from the file $RLFLEET_TOKEN_FILE names (a Swarm or Kubernetes secret: its trailing newline is dropped),
    # when $RLFLEET_TOKEN is empty or unset.
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    for variable in ({"RLFLEET_TOKEN": ""}, {}):
        from_file = {k: v for k, v in ENV.items() if k != "RLFLEET_TOKEN"} | variable
        from_file["RLFLEET_TOKEN_FILE"] = str(secret)
        out = rlfleet("status", "--learner", address, "--json", env=from_file)
        assert out.returncode == 0, out.stderr
    secret.write_text("wrong\n")
    refused = rlfleet("status", "--learner", address, env=dict(ENV, RLFLEET_TOKEN_FILE=str(secret)))
    assert refused.returncode == 2 and "token" in refused.stderr


def test_mutual_tls(procs, tmp_path, free_port, certs):
    replay, learner, address = _start(
        procs,
        tmp_path,
        free_port,
        "--tls-cert",
        certs / "server.pem",
        "--tls-key",
        certs / "server.key",
        "--tls-client-ca",
        certs / "ca.pem",
        "--token",
        "s3cret",
    )
    client = ("--tls-ca", certs / "ca.pem", "--tls-cert", certs / "client.pem", "--tls-key", certs / "client.key")
    wait_for(
        lambda: rlfleet("health", "--learner", address, *client).returncode == 0,
        180,
        "the TLS learner",
        [replay, learner],
    )
    # Plaintext, and TLS without a client certificate, are refused at the handshake.
    for args in ((), ("--tls-ca", certs / "ca.pem")):
        out = rlfleet("actor", "--learner", address, "--token", "s3cret", "--connect-timeout", 10, *args, timeout=120)
        assert out.returncode == 2 and "learner" in out.stderr and "--tls-ca" in out.stderr, out.stderr
    out = rlfleet("status", "--learner", address, "--token", "s3cret", timeout=60)
    assert out.returncode == 2 and "--tls-ca" in out.stderr
    secure = ClientSecurity(str(certs / "ca.pem"), str(certs / "client.pem"), str(certs / "client.key"), "s3cret")
    assert _inserts(get_status(address, 5, secure)) == 0

    actor = procs.start("actor", "actor", "--learner", address, *client, "--token", "s3cret")
    # (The actor reports its policy version in heartbeats, once a second: in-process CartPole envs fill the
    # 300-item warm-up before the first one, so learning can start before status shows the version.)
    st = wait_for(
        lambda: (
            (s := get_status(address, 5, secure))
            and s["actors"]
            and s["learner_steps"] > 0
            and s["actors"][0]["policy_version"] >= 0
            and s
        ),
        180,
        "the TLS actor to join with weights and learning to start",
        [learner, actor],
    )
    assert st["actors"][0]["host"]


def _port_open(address) -> bool:
    import socket

    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def _server_certificate(certs, folder, name, days=(-10, -1), addresses=()):
    """A server certificate signed by the test CA, valid from `days[0]` to `days[1]` days from now and naming the
    IP `addresses`: (certificate, key) paths in `folder`."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days[0]))
        .not_valid_after(now + datetime.timedelta(days=days[1]))
    )
    if addresses:
        names = [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (folder / f"{name}.key").write_bytes(pem)
    return folder / f"{name}.pem", folder / f"{name}.key"


def test_tls_failures_name_their_cause(procs, tmp_path, free_port, certs):
    """A certificate that does not name the address dialled is said so by the actor and status (not "no
    connection, check the address"); an expired certificate is refused when the learner starts."""
    # A learner on 127.0.0.1 whose certificate names 127.0.0.3 alone.
    cert, key = _server_certificate(certs, tmp_path, "elsewhere", days=(-1, 2), addresses=("127.0.0.3",))
    replay, learner, address = _start(procs, tmp_path, free_port, "--tls-cert", cert, "--tls-key", key)
    ca = ("--tls-ca", certs / "ca.pem")
    wait_for(lambda: _port_open(address), 180, "the learner's port", [learner])
    for command in (("actor", "--learner", address, "--connect-timeout", 10), ("status", "--learner", address)):
        out = rlfleet(*command, *ca, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "the learner's TLS certificate is not accepted for 127.0.0.1" in out.stderr, out.stderr
        assert "mismatch" in out.stderr and "subjectAltName" in out.stderr
    cert, key = _server_certificate(certs, tmp_path, "expired server")
    out = rlfleet("learner", *DQN, "--replay", f"127.0.0.1:{replay.port}", "--logdir", tmp_path / "run2",
                  "--tls-cert", cert, "--tls-key", key, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "the certificate CN=expired server expired on" in out.stderr, out.stderr
    assert "renew it" in out.stderr and not (tmp_path / "run2").exists()


def test_an_unreadable_or_empty_token_file_is_refused_naming_it(tmp_path):
    missing, empty = tmp_path / "no-secret", tmp_path / "empty-secret"
    empty.write_text("\n")
    for path, said in ((missing, "cannot read the token file"), (empty, "the token file is empty")):
        for command in (("status", "--learner", "127.0.0.1:1"), ("actor", "--learner", "127.0.0.1:1")):
            out = rlfleet(*command, env=dict(ENV, RLFLEET_TOKEN_FILE=str(path)), timeout=120)
            assert out.returncode == 2, out.stderr[-2000:]
            assert f"$RLFLEET_TOKEN_FILE ({path}): {said}" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize(
    "where,token,named",
    [("env", "s3cret\n", "$RLFLEET_TOKEN"), ("flag", "sécret", "--token"), ("env", " s3cret", "$RLFLEET_TOKEN")],
)
def test_a_token_grpc_cannot_carry_is_refused_by_every_command_at_start(tmp_path, where, token, named):
    """A token file's trailing newline, a non-ASCII letter, a stray space: the learner would start and refuse
    every client with a message that never mentions the token. Each command refuses it before it starts."""
    flag = ("--token", token) if where == "flag" else ()
    env = dict(ENV, RLFLEET_TOKEN=token) if where == "env" else ENV
    commands = [
        ("status", "--learner", "127.0.0.1:1", *flag),
        ("actor", "--learner", "127.0.0.1:1", *flag),
        ("learner", "--algo", "dqn", "--env", "CartPole-v1", "--replay", "127.0.0.1:1", "--logdir", tmp_path / "l")
        + flag,
    ]
    if where == "env":  # `up` takes the token from the environment only
        commands.append(("up", "--algo", "dqn", "--env", "CartPole-v1", "--total-steps", 100, "--logdir", tmp_path))
    for command in commands:
        out = rlfleet(*command, env=env, timeout=120)
        assert out.returncode == 2, (command, out.stderr[-2000:])
        assert f"rlfleet: error: {named}: the token holds" in out.stderr, (command, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "logs").exists()  # `up` started nothing
