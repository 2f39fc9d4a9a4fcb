"""Why a URL gave nothing: exceptions and responses mapped to the reasons recorded in a
result document's `errors` (docs/results.md).

Reasons: `invalid_url`, `robots`, `private_address`, `denied`, `http_<code>`, `timeout`, `dns`,
`connection`, `too_large`, `not_text`, `redirect_loop`, `data_loss`, `not_on_page`, `no_mapping`,
`host_busy` (other crawl processes kept the host longer than a request may wait), `goal_reached`
(internal: the request was dropped because its records were done), `error`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadCancelledError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    IgnoreRequest,
    ResponseDataLossError,
    StopDownload,
    UnsupportedURLSchemeError,
)
from scrapy.spidermiddlewares.httperror import HttpError
from twisted.internet import error as txerror
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

# request meta: the reason a download was stopped on purpose (headers or size seen on the way)
STOP_REASON = "enrich_stop_reason"
PRIVATE_MARK = "private_address"  # in the message of the resolver's refusal
# host names the resolver refused because they resolve to internal addresses (this process); the
# connection layer reports them as plain DNS failures, the reason must say why
PRIVATE_NAMES: set[str] = set()

_DNS = (CannotResolveHostError, txerror.DNSLookupError)
_TIMEOUT = (DownloadTimeoutError, txerror.TimeoutError, TimeoutError)
_CONNECTION = (
    DownloadConnectionRefusedError,
    txerror.ConnectionRefusedError,
    txerror.ConnectError,
    txerror.ConnectionLost,
    txerror.ConnectionDone,
    ResponseNeverReceived,
    ResponseFailed,
    ConnectionError,
    DownloadFailedError,
    # the proxy would not open a tunnel to the host; why is in its error header, which the
    # downloader adds to the message ("(proxy error: dns)"): read below like any connection error
    TunnelError,
)


class Refused(IgnoreRequest):
    """A request refused by policy; `reason` is the recorded reason (robots, denied, ...)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def reason_for_response(status: int, headers: Any = None) -> str:
    if headers is not None and status in (502, 503, 504):
        proxy_error = headers.get(b"X-Proxy-Error") if hasattr(headers, "get") else None
        if proxy_error:
            value = proxy_error.decode("latin-1") if isinstance(proxy_error, bytes) else proxy_error
            value = value.lower()
            if value in ("dns", "dns_failure"):
                return "dns"
            if value == "timeout":
                return "timeout"
            if value in ("connect", "unreachable", "connection"):
                return "connection"
    return f"http_{status}"


def _text_of(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {exc}"]
    for inner in getattr(exc, "reasons", None) or []:  # ResponseFailed & co wrap Failures
        value = getattr(inner, "value", inner)
        parts.append(f"{type(value).__name__}: {value}")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        parts.append(f"{type(cause).__name__}: {cause}")
    return " | ".join(parts).lower()


def reason_for_exception(exc: BaseException, request: Any = None) -> str:
    reason = _reason_for_exception(exc, request)
    if reason == "dns" and PRIVATE_NAMES and request is not None:
        host = (urlsplit(getattr(request, "url", "")).hostname or "").lower()
        if host in PRIVATE_NAMES:
            return "private_address"
    return reason


def _reason_for_exception(exc: BaseException, request: Any = None) -> str:
    meta = getattr(request, "meta", None) or {}
    if meta.get(STOP_REASON):
        return meta[STOP_REASON]
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and isinstance(exc, IgnoreRequest):
        return reason
    if isinstance(exc, HttpError):
        response = exc.response
        return reason_for_response(response.status, response.headers)
    text = _text_of(exc)
    if PRIVATE_MARK in text:
        return "private_address"
    if isinstance(exc, StopDownload):
        return "not_text"
    if isinstance(exc, IgnoreRequest):
        if "max redirections" in text or "redirect" in text:
            return "redirect_loop"
        if "download_maxsize" in text or "decompress" in text:
            return "too_large"
        if "robots" in text:
            return "robots"
        if "offsite" in text:
            return "denied"
        return "ignored"
    if isinstance(exc, DownloadCancelledError):
        return "too_large"
    if isinstance(exc, _DNS):
        return "dns"
    if isinstance(exc, _TIMEOUT):
        return "timeout"
    if isinstance(exc, ResponseDataLossError):
        return "data_loss"
    if isinstance(exc, UnsupportedURLSchemeError):
        return "invalid_url"
    if isinstance(exc, _CONNECTION):
        if "maxsize" in text or "cancelled" in text or "max size" in text:
            return "too_large"
        if "dns" in text or "resolve" in text:
            return "dns"
        if "timeout" in text or "timed out" in text:
            return "timeout"
        return "connection"
    if "decompress" in text or "maxsize" in text or "too large" in text:
        return "too_large"
    if "timed out" in text or "timeout" in text:
        return "timeout"
    return "error"
