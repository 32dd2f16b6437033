"""Where the service connects when a client names the place (a job's document `url`, a `webhook_url`): public
addresses only, unless an operator allowed the host (job_url_allowed_hosts). The guard against request
forgery, one for every such connection.

- Checked after name resolution: every address a name resolves to must be allowed (a name with one public
  and one loopback address is refused), and IP literals in any form the resolver would accept (decimal
  `2130706433`, hex `0x7f.1`, IPv6 `[::ffff:127.0.0.1]`) are read as the address they stand for.
- Checked on every connection: a redirect is a new connection, checked again.
- The connection goes to the address that was checked: the name is resolved once, here, and the socket is
  opened to that address (httpcore's network backend; TLS still checks the certificate against the name).
  No second lookup can answer differently (DNS rebinding).
- Refused: loopback, private (RFC 1918, and the rest Python's ipaddress calls private), link-local,
  unique-local (fc00::/7), multicast, the cloud metadata addresses, and anything else not global (unspecified,
  shared 100.64/10, documentation, reserved). IPv6 forms that carry an IPv4 address (mapped ::ffff:a.b.c.d,
  compatible ::a.b.c.d, NAT64 64:ff9b::/96, 6to4 2002::/16) are judged by the IPv4 address they carry.
  Each kind is its own error code (ocr_app/errors.py), a 400.

The resolver is a parameter (RESOLVER by default, the system's getaddrinfo): tests answer names themselves.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from .errors import (
    AddressRefused,
    LinkLocalRefused,
    LoopbackRefused,
    MetadataRefused,
    MulticastRefused,
    PrivateRefused,
    ReservedRefused,
    UniqueLocalRefused,
    UrlUnresolvable,
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses to connect to, as text.
Resolver = Callable[[str, int], Awaitable[list[str]]]

# Instance metadata services: AWS, GCP, Azure, OpenStack (IPv4 link-local, refused as such anyway, but named
# for what it is), AWS's IPv6 one, Alibaba Cloud's.
METADATA = {
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("fd00:ec2::254"),
    ipaddress.ip_address("100.100.100.200"),
}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


RESOLVER: Resolver = system_resolver


def carried(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), else the address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _COMPATIBLE and int(ip) > 1):  # :: and ::1 are themselves
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def refusal(ip: IPAddress) -> type[AddressRefused] | None:
    """The kind of refusal for an address, None for a public one."""
    ip = carried(ip)
    if ip in METADATA:
        return MetadataRefused
    if ip.is_loopback:
        return LoopbackRefused
    if ip.is_link_local:
        return LinkLocalRefused
    if ip.is_multicast:
        return MulticastRefused
    if ip in _UNIQUE_LOCAL:
        return UniqueLocalRefused
    if ip.is_unspecified or ip.is_reserved:
        return ReservedRefused
    if ip.is_private:
        return PrivateRefused
    if not ip.is_global:
        return ReservedRefused
    return None


def ip_literal(host: str) -> IPAddress | None:
    """The address a host stands for when it is an address: dotted, IPv6, or the shorthands inet_aton
    accepts (the resolver would: 2130706433, 0x7f.1, 0177.0.0.1)."""
    # mutation: NumberReplacer to `split("%", 2)` is equivalent: part 0 is what precedes the first "%"
    # whatever the number of splits past the first.
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if text and all(c in "0123456789abcdefxABCDEFX." for c in text) and text[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def _network(entry: str) -> IPNetwork | None:
    """An entry of job_url_allowed_hosts as the network it names (an address: its /32 or /128), or None."""
    try:
        return ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return None


def _name(entry: str) -> str:
    return entry.lower().rstrip(".")


def allowed_host_entry(entry: str) -> bool:
    """An entry of job_url_allowed_hosts: an IP network (or address), or a host name."""
    if _network(entry) is not None:
        return True
    name = _name(entry)
    # mutation: ReplaceComparisonOperator_Lt_LtE to `0 <= len(name)` is equivalent: the empty name's one
    # label, "", is no _LABEL ({1,63}), whatever the bound says of its length.
    # mutation: NumberReplacer to `-1 < len(name)` is equivalent, as that one.
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


# mutation: ReplaceTrueWithFalse here is equivalent: nothing assigns to a policy's fields.
@dataclass(frozen=True)
class Policy:
    """Hosts an operator opened (job_url_allowed_hosts): names (exact, any case) and networks."""

    names: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, entries: Iterable[str]) -> Policy:
        names, networks = set(), []
        for entry in entries:
            network = _network(entry)
            if network is None:
                names.add(_name(entry))
            else:
                networks.append(network)
        return cls(frozenset(names), tuple(networks))

    def opens(self, host: str, ip: IPAddress) -> bool:
        return _name(host) in self.names or any(ip in net for net in self.networks)


async def checked_address(host: str, port: int, policy: Policy, resolver: Resolver | None = None) -> str:
    """The address to connect to for host: resolved once, every address allowed, else AddressRefused
    (its kind) or UrlUnresolvable."""
    literal = ip_literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            found = await (resolver or RESOLVER)(host, port)
        except (OSError, UnicodeError) as err:
            raise UrlUnresolvable(f"{host} could not be resolved ({err})") from None
        # mutation: NumberReplacer to `split("%", 2)` is equivalent: part 0 is the same (as in ip_literal).
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
        if not addresses:
            raise UrlUnresolvable(f"{host} could not be resolved (no address)")
    for ip in addresses:
        kind = None if policy.opens(host, ip) else refusal(ip)
        if kind is not None:
            raise kind(
                f"{host} resolves to {ip}, a {kind.kind} address: the service does not connect there for a "
                "client (an operator can allow a host with job_url_allowed_hosts)"
            )
    return str(addresses[0])


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the guard: every TCP connection goes to the checked address."""

    def __init__(self, policy: Policy, resolver: Resolver | None = None) -> None:
        self.policy = policy
        self.resolver = resolver
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = await checked_address(host, port, self.policy, self.resolver)
        return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("unix sockets are never connected to for a client")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_client(policy: Policy, timeout_s: float, resolver: Resolver | None = None) -> httpx.AsyncClient:
    """An httpx client whose every connection is guarded: no redirects followed by itself (the caller checks
    each), no proxy or settings from the environment (a proxy would connect instead of us, unchecked)."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    # httpx (pinned, 0.28) builds its httpcore pool without a network-backend parameter: the pool is
    # replaced by one with the guard, the TLS context kept.
    ssl_context = transport._pool._ssl_context
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context, network_backend=GuardedBackend(policy, resolver)
    )
    # mutation: ReplaceFalseWithTrue to `trust_env=True, timeout` is equivalent: given a transport, httpx
    # (0.28) takes no proxy from the environment whatever the client's trust_env; it says so again here.
    return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False, timeout=timeout_s)
