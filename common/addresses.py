"""Addresses people give rlfleet to listen on: IPv4, IPv6 and host names, written as gRPC takes them, and the exact
reason one cannot be bound."""

from __future__ import annotations

import errno
import ipaddress
import socket


def bare_host(host: str) -> str:
    """`host` without the brackets of an IPv6 literal ("[::1]" -> "::1")."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def host_port(host: str, port: int | str) -> str:
    """ "host:port" as gRPC and people read it: an IPv6 literal in brackets ("[::1]:8001")."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_problem(host: str, port: int) -> str | None:
    """Why a TCP server cannot listen on `host` (an IPv4 or IPv6 address or a host name) and `port`; None if it
    can (on at least one of the addresses `host` stands for).

    The reasons: the name does not resolve, the address belongs to no interface of this machine, the port is
    held by another process, or it needs privileges. Probes with a socket that is closed at once.
    """
    host = bare_host(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return (
            f"the host name {host!r} does not resolve ({e.strerror}); give an IP address of this machine, a name "
            "that resolves to one, 0.0.0.0 (every IPv4 interface) or :: (every interface)"
        )
    problems = []
    for family, kind, proto, _, sockaddr in infos:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError as e:
            problems.append(f"{sockaddr[0]}: {e.strerror}")
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT does not hold a port
            if family == socket.AF_INET6 and sockaddr[0] == "::":
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind(sockaddr)
                return None
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    problems.append(f"port {port} is held by another process")
                elif e.errno == errno.EADDRNOTAVAIL:
                    problems.append(f"{sockaddr[0]} is not an address of this machine")
                elif e.errno == errno.EACCES:
                    problems.append(f"port {port} needs privileges (ports below 1024 do)")
                else:
                    problems.append(f"{sockaddr[0]}: {e.strerror}")
    unique = list(dict.fromkeys(problems))
    if not unique:
        return f"{host} resolves to no address"
    literal = all(info[4][0] == host for info in infos)  # an address, not a name: the problems name it already
    return "; ".join(unique) if literal else f"{host} ({'; '.join(unique)})"


WILDCARDS = ("0.0.0.0", "::")  # bind addresses that mean every interface


def is_wildcard(host: str) -> bool:
    """Whether `host` (a --bind value) means every interface of this machine."""
    return bare_host(host) in WILDCARDS


def routable_address() -> str | None:
    """An address of this machine that other machines can reach (not loopback), as its host name resolves on this
    machine; None where it resolves to loopback alone. Resolves names only: nothing is sent."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if not (address.is_loopback or address.is_link_local or address.is_unspecified):
            return str(address)
    return None
