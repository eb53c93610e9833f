"""Transport security for the learner's gRPC service: TLS and a shared token.

Server side: `server_credentials` (TLS, optionally requiring client
certificates); the token check (every `rlfleet.Learner` call must carry
`authorization: Bearer TOKEN` metadata; the gRPC health service stays open so
container health checks need no secret) is `rlfleet.learner.servicer.TokenInterceptor`. Client side: `channel` builds an
insecure or TLS channel that adds the token to every call.

Reverb has no authentication of its own: the replay port must stay on a private
network (see README, "Security").
"""

from __future__ import annotations

import collections
import dataclasses
import os

import grpc

from rlfleet.proto.arrays import GRPC_OPTIONS

TOKEN_ENV = "RLFLEET_TOKEN"  # where every command reads the shared token from when --token is not given
# Or a file that holds it (a Docker Swarm or Kubernetes secret mounted as a file), read when TOKEN_ENV is unset.
TOKEN_FILE_ENV = "RLFLEET_TOKEN_FILE"
METADATA_KEY = "authorization"
PROTECTED_PREFIX = "/rlfleet.Learner/"
# gRPC's default reconnect backoff grows to 120 s; capped at 2 s, clients (actors above all) are back within
# about 2 s of a restarted learner answering, whatever the length of the outage.
# Keepalive: a connection that died without a FIN or RST (a NAT or firewall that dropped its state, a frozen
# host) leaves every call on it waiting, and new calls go to it too: a ping unanswered for
# CLIENT_KEEPALIVE_TIMEOUT_MS after CLIENT_KEEPALIVE_TIME_MS closes it, and the channel connects anew. The
# learner permits pings this often (`rlfleet.learner.servicer.KEEPALIVE_OPTIONS`), so it never answers them
# with GOAWAY too_many_pings.
CLIENT_KEEPALIVE_TIME_MS = 10_000
CLIENT_KEEPALIVE_TIMEOUT_MS = 5_000
_CLIENT_OPTIONS = GRPC_OPTIONS + [
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", CLIENT_KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", CLIENT_KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class SecurityError(ValueError):
    """Unreadable or incomplete TLS material, or a token gRPC cannot carry; the message names the file, option
    or variable."""


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise SecurityError(f"{what} {path}: cannot read it ({e.strerror}); pass a PEM file that exists.") from None


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """How a client (actor, status, health) talks to the learner.

    Fields: `tls_ca` PEM path of the CA that signed the learner's certificate
    (setting it turns TLS on); `tls_cert`/`tls_key` PEM paths of this client's
    certificate and key (for a learner started with --tls-client-ca); `token`
    the shared token ("" = none; defaults to $RLFLEET_TOKEN in the CLI).
    """

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str = ""


def channel(address: str, security: ClientSecurity | None = None) -> grpc.Channel:
    """A channel to the learner at `address` ("host:port") with TLS and the token as configured.

    Raises:
        SecurityError: a PEM file cannot be read, or only one of cert/key is given.
    """
    s = security or ClientSecurity()
    if bool(s.tls_cert) != bool(s.tls_key):
        raise SecurityError("--tls-cert and --tls-key go together (this client's certificate and its key).")
    if s.tls_ca or s.tls_cert:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(s.tls_ca, "--tls-ca"),
            private_key=_read(s.tls_key, "--tls-key"),
            certificate_chain=_read(s.tls_cert, "--tls-cert"),
        )
        ch = grpc.secure_channel(address, creds, options=_CLIENT_OPTIONS)
    else:
        ch = grpc.insecure_channel(address, options=_CLIENT_OPTIONS)
    if s.token:
        ch = grpc.intercept_channel(ch, _AddToken(s.token))
    return ch


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _AddToken(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamStreamClientInterceptor
):
    def __init__(self, token: str):
        self.metadata = (METADATA_KEY, f"Bearer {token}")

    def _details(self, d):
        return _CallDetails(
            d.method,
            d.timeout,
            list(d.metadata or []) + [self.metadata],
            d.credentials,
            d.wait_for_ready,
            d.compression,
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials for the learner: its certificate chain and key (PEM paths); with `client_ca`,
    clients must present a certificate signed by that CA (mutual TLS).

    Raises:
        SecurityError: a file cannot be read.
    """
    return grpc.ssl_server_credentials(
        [(_read(key, "--tls-key"), _read(cert, "--tls-cert"))],
        root_certificates=_read(client_ca, "--tls-client-ca"),
        require_client_auth=bool(client_ca),
    )


def token_from_env(token: str | None) -> str:
    """`token` if given, else a non-empty $RLFLEET_TOKEN, else the content of the file that $RLFLEET_TOKEN_FILE
    names (one trailing newline dropped: a Docker or Kubernetes secret file), else "" (no token).

    Raises:
        SecurityError: the token file cannot be read, or the token holds a character that gRPC metadata cannot
            carry (only printable ASCII, without leading or trailing spaces, arrives unchanged), naming --token,
            the variable or the file; the learner would otherwise start and refuse every client with a message
            that does not mention it.
    """
    path = os.environ.get(TOKEN_FILE_ENV, "")
    if token is not None:
        source, value = "--token", token
    elif os.environ.get(TOKEN_ENV) or not path:
        source, value = f"${TOKEN_ENV}", os.environ.get(TOKEN_ENV, "")
    else:
        source = f"${TOKEN_FILE_ENV} ({path})"
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                value = f.read().removesuffix("\n").removesuffix("\r")
        except OSError as e:
            raise SecurityError(
                f"{source}: cannot read the token file ({e.strerror}); mount the secret there or unset "
                f"{TOKEN_FILE_ENV}."
            ) from None
        if not value:  # a secret that is there must not turn the token check off
            raise SecurityError(f"{source}: the token file is empty; put the token in it or unset {TOKEN_FILE_ENV}.")
    bad = sorted({c for c in value if not " " <= c <= "~"})
    if bad or value != value.strip(" "):
        what = f"the characters {', '.join(repr(c) for c in bad)}" if bad else "leading or trailing spaces"
        raise SecurityError(
            f"{source}: the token holds {what}, which gRPC metadata cannot carry; use printable ASCII only "
            f"(a token file's trailing newline: {TOKEN_ENV}=\"$(tr -d '\\n' < FILE)\"; a new token: "
            "openssl rand -hex 32)."
        )
    return value
