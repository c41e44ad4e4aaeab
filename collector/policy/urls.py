"""URL checks done before anything is fetched: scheme, host, and which networks may be reached.

A source may only fetch ``http`` and ``https`` URLs with a host. Unless the source sets
``allow_private_networks: true``, hosts that are (or resolve to) loopback, private, link-local,
multicast or reserved addresses are refused, so a seed list or a redirect cannot make a worker
probe its own network (SSRF). Every redirect hop is checked the same way.

URLs with credentials (``user:password@host``) are refused too: httpx cannot combine them with an
``Authorization`` header (every fetch of the source then crashed), and a password in a seed list
ends up in the frontier, logs and dead letters. Credentials belong in ``limits.headers`` (from a
Secret block). No message here ever shows the userinfo part of a URL (:func:`shown`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from collector.errors import PermanentFetchError, RecoverableFetchError
from collector.ops.scrub import REDACTED

__all__ = ["HostPolicy", "check_url_syntax", "shown"]

ALLOWED_SCHEMES = frozenset({"http", "https"})
CREDENTIALS_HINT = (
    "credentials in the URL are not allowed: send them in a header from a Secret block, "
    'e.g. limits.headers: {Authorization: "Basic ${secret:NAME}"} (docs/sources.md)'
)
_AUTHORITY_END = re.compile(r"[/?#]|$")


def shown(url: str) -> str:
    """``url`` quoted for a message, with any ``user:password@`` replaced by ``[redacted]@``
    (the one mask of every message, log line and stored entry: collector.ops.scrub).

    Done on the raw text, not with ``urlsplit`` (which fails on some of the very URLs reported,
    and reads ``http//user:pw@host`` as a path): the authority follows the first ``//`` (or the
    start) up to ``/``, ``?`` or ``#``, and its userinfo ends at its last ``@``, as ``urlsplit``
    reads it. Erring towards masking too much is fine here: it is only a message.
    """
    slashes = url.find("//")
    start = 0 if slashes < 0 else slashes + 2
    end = _AUTHORITY_END.search(url, start)
    stop = end.start() if end else len(url)
    at = url.rfind("@", start, stop)
    if at >= 0:
        url = f"{url[:start]}{REDACTED}{url[at:]}"
    return repr(url)


def check_url_syntax(url: str) -> str | None:
    """A one-line reason why ``url`` cannot be fetched, or None when its form is fine."""
    if not isinstance(url, str) or not url.strip():
        return "empty URL"
    if any(ch in url for ch in "\r\n\t "):
        return f"URL contains whitespace: {shown(url)}"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        return f"malformed URL {shown(url)}: {exc}"
    if not parts.scheme:  # "http//host/x", "host/x", "//host/x"
        return f"not an absolute URL (no scheme://host): {shown(url)}"
    if parts.scheme.lower() not in ALLOWED_SCHEMES:
        return f"URL scheme {parts.scheme!r} is not allowed (http, https): {shown(url)}"
    if not parts.hostname:
        return f"URL has no host: {shown(url)}"
    if port == 0:
        return f"URL has port 0: {shown(url)}"
    return None


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class HostPolicy:
    """Decides, once per host, whether the fetch engine may connect to it.

    Resolution results are cached per host for the life of the policy (one run), so the check
    costs one lookup per host, not per request.
    """

    def __init__(self, *, allow_private_networks: bool, allowed_hosts: Iterable[str] = ()) -> None:
        self.allow_private_networks = allow_private_networks
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self._verdicts: dict[str, str | None] = {}

    def refusal(self, url: str) -> str | None:
        """Why ``url`` must not be fetched, or None.

        Raises RecoverableFetchError when the host does not resolve (DNS may recover; the
        verdict is not cached).
        """
        reason = check_url_syntax(url)
        if reason is not None:
            return reason
        parts = urlsplit(url)
        if "@" in parts.netloc:
            return f"{CREDENTIALS_HINT}: {shown(url)}"
        return self.host_refusal((parts.hostname or "").lower())

    def host_refusal(self, host: str) -> str | None:
        """Why connecting to ``host`` (lower case, no port) is not allowed, or None. Cached."""
        if self.allowed_hosts and host not in self.allowed_hosts:
            return f"host {host!r} is not in limits.allowed_hosts"
        if self.allow_private_networks:
            return None
        if host not in self._verdicts:
            self._verdicts[host] = self._host_refusal(host)
        return self._verdicts[host]

    def address_refusal(self, host: str, address: str) -> str | None:
        """Why ``host`` may not be reached at ``address``, found when connecting, or None.

        The connection-time half of the check: :meth:`host_refusal` judged the name when the URL
        was checked, but a name can resolve differently a moment later (DNS rebinding).
        """
        if self.allow_private_networks:
            return None
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])  # no IPv6 zone id
        except ValueError:
            return f"host {host!r} resolved to {address!r}, which is not an IP address"
        if _is_public(ip):
            return None
        return (
            f"host {host!r} resolved to a private/loopback address ({ip}) when connecting; "
            "set allow_private_networks: true to allow it"
        )

    def check(self, url: str) -> None:
        """Raise PermanentFetchError(refused_url) when ``url`` must not be fetched."""
        reason = self.refusal(url)
        if reason is not None:
            raise PermanentFetchError(reason, error_class="refused_url")

    def check_request(self, scheme: str, host: str, url: str) -> None:
        """The per-request form of :meth:`check`, for parts the HTTP client already parsed."""
        if scheme not in ALLOWED_SCHEMES:
            reason: str | None = f"URL scheme {scheme!r} is not allowed (http, https): {shown(url)}"
        elif "@" in url and "@" in urlsplit(url).netloc:  # a redirect to user:password@host
            reason = f"{CREDENTIALS_HINT}: {shown(url)}"
        else:
            reason = self.host_refusal(host.lower())
        if reason is not None:
            raise PermanentFetchError(reason, error_class="refused_url")

    @staticmethod
    def _host_refusal(host: str) -> str | None:
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            if host == "localhost" or host.endswith(".localhost"):
                return f"host {host!r} is loopback; set allow_private_networks: true to allow it"
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except (socket.gaierror, UnicodeError) as exc:
                raise RecoverableFetchError(
                    f"host {host!r} does not resolve: {exc}", error_class="dns_error"
                ) from exc
            addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        for address in addresses:
            if not _is_public(address):
                return (
                    f"host {host!r} is a private/loopback address ({address}); "
                    "set allow_private_networks: true to allow it"
                )
        return None
