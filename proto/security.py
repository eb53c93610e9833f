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
import datetime
import os
import socket
import ssl

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
    """The PEM file `path` of option `what` (None: not given)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SecurityError(f"{what} {path}: cannot read it ({e.strerror}); pass a PEM file that exists.") from None
    return data


def check_certificate_files(*given: tuple[str, str | None, bool]) -> None:
    """Checks the dates of the certificates a command was given, when it starts: (option, PEM path or None,
    whether the file is CA certificates), e.g. ("--tls-cert", path, False). A certificate's own file is refused
    when its first certificate (the leaf) has expired or is not valid yet; a CA file when none of its
    certificates is valid now (a bundle may hold old ones). A file `cryptography` cannot read is left to TLS.

    Raises:
        SecurityError: naming the option, the file, the certificate's subject and dates, and the fix.
    """
    for what, path, is_ca in given:
        if not path:
            continue
        pem = _read(path, what)
        try:
            check_certificate_dates(pem, f"{what} {path}", every=is_ca)
        except _Unreadable:
            continue


class _Unreadable(Exception):
    """The PEM data holds no certificate `cryptography` reads."""


def check_certificate_dates(pem: bytes, what: str, now: datetime.datetime | None = None, every: bool = False) -> None:
    """Refuses certificates out of their dates: a peer would refuse them at every handshake, and each side would
    only say the connection failed. The first certificate of `pem` is checked (a certificate file: the leaf,
    then its chain), or with `every` (a CA bundle) the file is refused only when none is valid now.

    Raises:
        SecurityError: naming `what`, the certificate's subject and its validity, and the fix.
        _Unreadable: no certificate in `pem` that `cryptography` reads.
    """
    from cryptography import x509

    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise _Unreadable() from None
    if every and any(c.not_valid_before_utc <= now <= c.not_valid_after_utc for c in certificates):
        return
    cert = certificates[0]
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    subject = cert.subject.rfc4514_string() or "(no subject)"
    if now > end:
        raise SecurityError(
            f"{what}: the certificate {subject} expired on {end:%Y-%m-%d %H:%M} UTC; renew it (a new one signed by "
            "the same CA) and start again."
        )
    if now < start:
        raise SecurityError(
            f"{what}: the certificate {subject} is valid only from {start:%Y-%m-%d %H:%M} UTC (this machine's "
            "clock says it is earlier); check the clock, or issue it with an earlier start."
        )


def tls_problem(address: str, security: ClientSecurity | None, timeout_s: float = 5.0) -> str | None:
    """Why a TLS connection to the learner at `address` ("host:port") fails with this client's settings, found
    by one handshake of Python's `ssl` with the same CA and client certificate: the learner's certificate does not
    name that host, has expired, or was signed by another CA; None when the handshake succeeds, TLS is off, or
    nothing answers (then the address or the learner is the problem, which the caller says)."""
    s = security
    if not (s and (s.tls_ca or s.tls_cert)):
        return None
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") else host
    try:
        context = ssl.create_default_context(cafile=s.tls_ca) if s.tls_ca else ssl.create_default_context()
        if s.tls_cert and s.tls_key:
            context.load_cert_chain(s.tls_cert, s.tls_key)
        context.set_alpn_protocols(["h2"])
        with socket.create_connection((host, int(port)), timeout=timeout_s) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return None
    except ssl.SSLCertVerificationError as e:
        why = e.verify_message or str(e)
        if "hostname mismatch" in why.lower() or "ip address mismatch" in why.lower():
            fix = "connect with a name or address the certificate names (its subjectAltName), or give the learner "
            fix += f"a certificate that names {host}"
        elif "expired" in why.lower():
            fix = "renew the learner's certificate"
        else:
            fix = "pass --tls-ca the CA that signed the learner's certificate"
        return f"the learner's TLS certificate is not accepted for {host}: {why}; {fix}"
    except ssl.SSLError as e:
        return (
            f"the TLS handshake with {address} failed ({e.reason or e}): a learner that serves plaintext takes no "
            "--tls-* options; one that asks for client certificates takes --tls-cert and --tls-key"
        )
    except (OSError, ValueError):
        return None


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
