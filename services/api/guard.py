"""The API's safety rules (docs/api.md, "Safety"), one aiohttp middleware and one response
hook, in this order:

- Host: the Host header names a loopback name or address (localhost, 127.0.0.0/8, ::1;
  any port), one of the allowed hosts (`--api-allowed-host`), or the address the API is
  bound to when that is not loopback; else 421. A web page of another name that a DNS
  rebinding points at 127.0.0.1 so gets nothing. /healthz and /readyz are exempt (probes
  name the address they dial).
- CORS: a preflight (OPTIONS with Access-Control-Request-Method) from an origin of the
  allow-list (`--api-cors-origin`; none by default) is answered 204 with the
  Access-Control-Allow-* headers, from any other origin 403; any response to an allowed
  origin carries Access-Control-Allow-Origin. A plain OPTIONS answers 204 with Allow.
- Changes (every method but GET, HEAD, OPTIONS; the validate calls too): an Origin
  header that is neither the API's own origin (scheme, host, port of the request) nor in
  the allow-list is refused 403 (a browser sends Origin with every such request; a
  request without one, from curl or the CLI, has no page behind it); then the token
  (401); then the body's type must be application/json (415), which no cross-site
  "simple request" (a form, text/plain) can send without a preflight.
- Errors are JSON `{"error": ...}` for every status: aiohttp's 404, 405 and 413 too, a
  broker that does not answer is 503 with Retry-After, anything unexpected 500.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import urllib.parse

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from cep_core.errors import Category
from cep_service.api.errors import STATUS, Refused
from cep_service.errors import BrokerUnreachable

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
PROBES = frozenset({"/healthz", "/readyz"})
ALLOW_HEADERS = "Authorization, Content-Type"
PREFLIGHT_MAX_AGE_S = 600
BROKER_RETRY_S = 5
WILDCARDS = frozenset({"", "0.0.0.0", "::"})
TOKEN_ENV = "CEP_API_TOKEN"

logger = logging.getLogger("cep.api")


def json_response(data: Any, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS),
                        status=status, content_type="application/json", headers=headers)


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None,
                   **fields: Any) -> web.Response:
    return json_response({"error": message, **fields}, status, headers)


def loopback(host: str) -> bool:
    """localhost or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str | None:
    """The name of a Host header or a configured host, lower case, without its port and
    brackets (`[::1]:8080` -> `::1`); None if it is not one."""
    value = value.strip().lower()
    if not value or any(c.isspace() or c in "/?#@\\" for c in value):
        return None
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        try:
            return str(ipaddress.IPv6Address(name))
        except ValueError:
            return None
    if value.count(":") > 1:  # a bare IPv6 address (a configured host, not a header)
        try:
            return str(ipaddress.IPv6Address(value))
        except ValueError:
            return None
    name, colon, port = value.partition(":")
    if not name or (colon and not port.isdigit()):
        return None
    return name.rstrip(".") or None


def normal_origin(value: str) -> str:
    """An origin as browsers send it (`scheme://host[:port]`, lower case, no default
    port); ValueError if `value` is not one."""
    parts = urllib.parse.urlsplit(value.strip())
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"not an origin (scheme://host[:port]): {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or \
            parts.path not in ("", "/") or parts.query or parts.fragment or \
            parts.username or parts.password:
        raise ValueError(f"not an origin (scheme://host[:port]): {value!r}")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def own_origin(request: web.Request) -> str | None:
    """The API's origin as this request reached it: its scheme and Host header."""
    try:
        return normal_origin(f"{request.scheme}://{request.headers.get('Host', '')}")
    except ValueError:
        return None


class Guard:
    """The rules of one app: `allowed_hosts` (names, any port; `*`: any host),
    `cors_origins` (normalized origins), the token (None: changes need none), and the
    address the API is bound to."""

    def __init__(self, allowed_hosts: Iterable[str] = (), cors_origins: Iterable[str] = (),
                 token: str | None = None, bound: str | None = None,
                 max_body: int = 1024 * 1024):
        names = set()
        for given in allowed_hosts:
            name = "*" if given.strip() == "*" else host_name(given)
            if name is None:
                raise ValueError(f"not a host name: {given!r}")
            names.add(name)
        if bound is not None and bound not in WILDCARDS and not loopback(bound):
            names.add(host_name(bound) or bound)
        self.hosts = frozenset(names)
        self.origins = frozenset(normal_origin(o) for o in cors_origins)
        self.token, self.max_body = token or None, max_body

    # ------------------------------------------------------------ the rules

    def host_allowed(self, request: web.Request) -> bool:
        header = request.headers.get("Host")
        if header is None or request.path in PROBES or "*" in self.hosts:
            return True  # no Host: HTTP/1.0, not a browser
        name = host_name(header)
        return name is not None and (loopback(name) or name in self.hosts)

    def origin_allowed(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:  # browsers send Origin with every such request; a page's
            return request.headers.get("Sec-Fetch-Site") not in ("cross-site", "same-site")
        try:
            origin = normal_origin(origin)
        except ValueError:  # "null" (a sandboxed frame, a file): no page of ours
            return False
        return origin == own_origin(request) or origin in self.origins

    def cors_origin(self, request: web.Request) -> str | None:
        """The request's Origin if it is on the allow-list."""
        origin = request.headers.get("Origin")
        if origin is None or not self.origins:
            return None
        try:
            origin = normal_origin(origin)
        except ValueError:
            return None
        return origin if origin in self.origins else None

    def refusal(self, request: web.Request) -> web.Response | None:
        """The refusal of a request that is not let through, or None."""
        if not self.host_allowed(request):
            return error_response(421, f"the Host {request.headers.get('Host')!r} is not "
                                  "this API's: use localhost or 127.0.0.1, or allow the "
                                  "name with --api-allowed-host")
        if request.method in SAFE or \
                getattr(request.match_info, "http_exception", None) is not None:
            return None  # no route there: 404 or 405 (the handler raises it)
        if not self.origin_allowed(request):
            return error_response(403, "a change from the web page of another origin "
                                  f"({request.headers.get('Origin') or 'cross-site'}) is "
                                  "refused (allow it with --api-cors-origin)")
        if self.token and not request.path.endswith("/validate"):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return error_response(401, f"this change needs Authorization: Bearer "
                                      f"<{TOKEN_ENV}>")
        if (request.method != "DELETE" or request.body_exists) and \
                request.content_type != "application/json":
            return error_response(415, "the body of a change is JSON: send Content-Type: "
                                  f"application/json (not {request.content_type})")
        return None

    def options(self, request: web.Request) -> web.Response:
        """A preflight, or a plain OPTIONS."""
        methods = allowed_methods(request)
        if methods is None:
            return error_response(404, f"no such endpoint: {request.path}")
        allowed = ", ".join(sorted(methods | {"OPTIONS"}))
        if "Access-Control-Request-Method" not in request.headers or \
                "Origin" not in request.headers:
            return web.Response(status=204, headers={"Allow": allowed})
        origin = self.cors_origin(request)
        if origin is None:
            return error_response(403, f"the origin {request.headers['Origin']!r} is not "
                                  "allowed (CORS: --api-cors-origin)")
        return web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": allowed,
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S), "Vary": "Origin"})

    # ------------------------------------------------------------ aiohttp

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        if request.method == "OPTIONS":
            return self.options(request)
        try:
            return await handler(request)
        except Refused as e:
            return json_response(e.body, e.status, e.headers)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return http_error(request, e, self.max_body)
        except BrokerUnreachable as e:
            return error_response(STATUS[e.category], f"the broker is unreachable: {e}",
                                  {"Retry-After": str(BROKER_RETRY_S)})
        except Exception:
            logger.exception("api: %s %s failed", request.method, request.path)
            return error_response(STATUS[Category.INTERNAL],
                                  "internal error (the API's log has it)")

    async def on_response_prepare(self, request: web.Request,
                                  response: web.StreamResponse) -> None:
        """Access-Control-Allow-Origin on every response to an allowed origin (the
        tail's stream too, whose headers go before its body)."""
        if not self.origins:
            return
        origin = self.cors_origin(request)
        if origin is not None and request.method != "OPTIONS":
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "Retry-After"
        vary = response.headers.get("Vary", "")
        if "origin" not in vary.lower():
            response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"


def allowed_methods(request: web.Request) -> set[str] | None:
    """The methods of the request's route; None if there is no route there."""
    failed = getattr(request.match_info, "http_exception", None)
    if failed is None:
        return {request.method}
    if isinstance(failed, web.HTTPMethodNotAllowed):
        return set(failed.allowed_methods)
    return None


def http_error(request: web.Request, e: web.HTTPException, max_body: int) -> web.Response:
    """aiohttp's exception as a JSON error, its headers (Allow) kept."""
    status = e.status
    headers = {k: v for k, v in e.headers.items()
               if k.lower() not in ("content-type", "content-length")}
    if status == 404:
        message = f"no such endpoint: {request.method} {request.path}"
    elif isinstance(e, web.HTTPMethodNotAllowed):
        message = f"{request.method} is not allowed on {request.path} (allowed: " \
                  f"{', '.join(sorted(e.allowed_methods))})"
    elif status == 413:
        message = f"the body is too large: at most {max_body} bytes"
    else:
        message = e.text if e.text and not e.text.startswith(f"{status}:") else \
            e.reason or str(status)
    return error_response(status, message, headers)
