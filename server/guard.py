"""Who may talk to the server, decided from the request head alone, before any body is read.

Three checks, in order, on every HTTP request and WebSocket handshake (`Guard`, an ASGI middleware inside CORS and
outside the body limit):

1. Host: a `Host` header that names another server is refused with 400 (DNS rebinding: a page on a name its owner
   points at 127.0.0.1 sends that name). Bound to a loopback address, only loopback names are this server's; bound
   to a specific address, that address (and loopback names); bound to 0.0.0.0 or ::, any Host. `--allowed-hosts`
   adds names (`*`: any).
2. Key: with an API key, `/v1` (HTTP and the WebSocket) needs `Authorization: Bearer KEY`; 401 otherwise, before
   the body is read (an upload without the key costs its sender, not the server). The comparison takes constant
   time.
3. Origin: a browser's state-changing request (POST, PUT, PATCH, DELETE) and every WebSocket handshake from a page
   on another origin is refused with 403 (cross-site requests: a page elsewhere must not create voices or speak
   through this server). A request without `Origin` (curl, the SDK) passes; so does the server's own page (its
   origin names the request's own Host), and origins listed in `--cors-origins` or `--allowed-origins` (`*`: any).
   `Origin: null` (sandboxed frames, local files) is another origin. This applies with a key too: a key typed into
   a page elsewhere is not to be usable from there either, and one rule is simpler to reason about.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from server import errors
from server.state import ServerState

ANY = "*"
WILDCARD_BINDS = ("", "0.0.0.0", "::")
CHANGES_STATE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
KEYED_PREFIX = "/v1"
ENV_HOSTS, ENV_ORIGINS = "TALKSTREAM_ALLOWED_HOSTS", "TALKSTREAM_ALLOWED_ORIGINS"


@dataclass(frozen=True, slots=True)
class SitePolicy:
    """Which Hosts are this server's and which other origins may change its state (besides `--cors-origins`)."""

    bind: str = "127.0.0.1"  # the address served on: it decides the Hosts allowed by default
    hosts: tuple[str, ...] = ()  # more allowed Host names, with or without a port (`*`: any)
    origins: tuple[str, ...] = ()  # more allowed origins, as `scheme://host[:port]` (`*`: any)

    @classmethod
    def from_settings(cls, bind: str, hosts: str | None = None, origins: str | None = None) -> SitePolicy:
        """From comma-separated flags, each defaulting to its TALKSTREAM_ALLOWED_* variable."""
        return cls(bind, _split(hosts if hosts is not None else os.environ.get(ENV_HOSTS, "")),
                   _split(origins if origins is not None else os.environ.get(ENV_ORIGINS, "")))


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


Authority = tuple[str, int | None]  # a host name or address (IPv6 without brackets), and the port if one is given


def authority(value: str) -> Authority | None:
    """`host`, `host:port`, `[v6]` or `[v6]:port`, lowercased and without a trailing dot; None when malformed."""
    text = value.strip().lower()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    else:
        host, colon, port_text = text.rpartition(":")
        host, port = (host, port_text) if colon else (text, None)
        if ":" in host:  # an IPv6 address must be in brackets
            return None
    if port is not None and not (port.isdigit() and int(port) <= 65535):
        return None
    host = host.removesuffix(".")  # the root's dot: `localhost.` is `localhost`
    if not host or host.startswith(".") or host.endswith(".") or ".." in host:  # an empty label: no name
        return None
    return host, int(port) if port is not None else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class Hosts:
    """The Host names this server answers to (see the module's docstring)."""

    def __init__(self, policy: SitePolicy) -> None:
        bind = policy.bind.strip().strip("[]").lower()
        self.any = ANY in policy.hosts or (bind in WILDCARD_BINDS and not policy.hosts)
        self.bind = bind if not is_loopback(bind) else None
        self.extra = [a for a in (authority(h) for h in policy.hosts if h != ANY) if a is not None]

    def allows(self, host: Authority) -> bool:
        name, port = host
        if self.any or is_loopback(name) or name == self.bind:
            return True
        return any(name == n and (p is None or p == port) for n, p in self.extra)


class Origins:
    """Origins other than the request's own that may change state."""

    def __init__(self, listed: Iterable[str]) -> None:
        listed = [o.strip().lower().rstrip("/") for o in listed]
        self.any = ANY in listed
        self.listed = frozenset(listed)

    def allows(self, origin: str, host: Authority | None) -> bool:
        origin = origin.strip().lower().rstrip("/")
        return self.any or origin in self.listed or (host is not None and same_site(origin, host))


def same_site(origin: str, host: Authority) -> bool:
    """Whether `origin` (`scheme://host[:port]`) names the server the request's Host does: the same name and port,
    a missing port being the scheme's default on either side (behind a TLS proxy the Host often has none)."""
    scheme, sep, rest = origin.partition("://")
    theirs = authority(rest) if sep and scheme in DEFAULT_PORTS and "/" not in rest else None
    if theirs is None:
        return False
    default = DEFAULT_PORTS[scheme]
    return theirs[0] == host[0] and (theirs[1] or default) == (host[1] or default)


class Guard:
    def __init__(self, app: ASGIApp, state: ServerState, policy: SitePolicy, cors_origins: Iterable[str] = ()) -> None:
        self.app, self.state = app, state
        self.hosts = Hosts(policy)
        self.origins = Origins([*policy.origins, *cors_origins])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        err = self.check(scope)
        if err is None:
            await self.app(scope, receive, send)
            return
        self.state.metrics.error(err.detail.type, err.detail.code)
        response = err.response()
        if scope["type"] == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": err.detail.message[:120]})
            return
        await response(scope, receive, send)  # on a WebSocket: an HTTP answer instead of the upgrade

    def check(self, scope: Scope) -> errors.ApiError | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("host")
        if (refused := _host_count_error(scope)) is not None:
            return refused
        host = authority(given) if given is not None else None
        if given is not None and (host is None or not self.hosts.allows(host)):
            return errors.invalid(f"the Host header {given[:100]!r} does not name this server; start it with "
                                  "--allowed-hosts to serve that name", code="host_not_allowed")
        key = self.state.api_key
        refused = _key_error(headers.get("authorization", ""), key) if key and _keyed(_route_path(scope)) else None
        if refused is not None:
            return refused
        origin = headers.get("origin")
        changes = scope["type"] == "websocket" or scope["method"] in CHANGES_STATE
        if changes and origin is not None and not self.origins.allows(origin, host):
            return errors.forbidden(f"requests from the origin {origin[:100]!r} may not change this server's state; "
                                    "list it in --allowed-origins (or --cors-origins) to allow them",
                                    "origin_not_allowed")
        return None


def _host_count_error(scope: Scope) -> errors.ApiError | None:
    """One Host header, and one at all in HTTP/1.1 (RFC 9112 3.2): with two, which one a proxy and this server each
    read is anyone's guess."""
    count = sum(1 for k, _ in scope["headers"] if k == b"host")
    if count > 1 or (count == 0 and scope.get("http_version") == "1.1"):
        what = "more than one Host header" if count else "no Host header"
        return errors.invalid(f"the request has {what}; send exactly one", code="host_not_allowed")
    return None


def _route_path(scope: Scope) -> str:
    """The path the router matches: without the prefix a proxy serves the app under."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _keyed(path: str) -> bool:
    return path == KEYED_PREFIX or path.startswith(KEYED_PREFIX + "/")


def _key_error(header: str, expected: str) -> errors.ApiError | None:
    """Bearer auth; the comparison takes constant time."""
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return errors.unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return errors.unauthorized("incorrect API key")
    return None
