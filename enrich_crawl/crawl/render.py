"""JavaScript rendering, the light half: when to render, with what settings, and how it is counted.

Nothing here imports Playwright (or starts anything): a crawl whose mappings are all `static` never loads the browser
machinery (enrich_crawl.crawl.render_handler is installed as the download handler only when some
mapping asks for `js` or `auto`, see `needs_browser` and enrich_crawl.crawl.settings).

Policy per mapping (its `render` key, docs/mappings.md):

- `static`: pages are fetched and extracted as they come from the server;
- `js`: pages whose URL (known before fetching) matches the mapping are rendered directly: the
  render request fetches the document through the crawler's own HTTP stack and renders it; a
  page that only turns out to match after a redirect is rendered from the static answer;
- `auto`: the page is fetched static first; it is rendered only when the mapping yields none of
  its fields on the static page *and* the page looks built by script (`looks_script_built`). The
  render starts from the static answer already in hand: the document is not fetched twice.

Rendered pages go through the same mappings (`page.rendered` is True: candidates and lineage say
`rendered`). A render that fails (renderer crash after one retry, timeout) leaves the record its
static page when there is one, and the reason (`render_crash`, `render_timeout`, `render_error`)
on the record.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from collections.abc import Mapping as Mapping_
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enrich_crawl.crawl.errors import Refused
from enrich_crawl.crawl.middlewares.guards import UrlPolicyMiddleware

if TYPE_CHECKING:
    from enrich_crawl.extract.mapping import Mapping
    from enrich_crawl.extract.page import Page

# request meta
RENDER = "enrich_render"  # "js" | "auto": render this request in the browser
DOCUMENT = "enrich_render_document"  # Document: render from this answer (no document fetch)
FETCHED = "enrich_render_fetched"  # the handler fetched the document itself (a `js` request)
WAIT_FOR = "enrich_render_wait_for"  # CSS selectors of the matching mappings' `wait_for`
SUBRESOURCE = "enrich_render_subresource"  # a request the browser made, fetched by the crawler
ABANDONED = "enrich_render_abandoned"  # the render gave up on this subresource: do not send it
RENDERED_FLAG = "rendered"  # Response.flags of a rendered page

RENDER_REASONS = ("render_crash", "render_timeout", "render_error")


@dataclass(frozen=True)
class RenderConfig:
    """Browser settings of one crawl process: defaults here, overridden by ENRICH_RENDER_<NAME>
    variables of the worker's environment, themselves overridden by WorkerParams.render."""

    # the whole render of one page: navigation, scripts, waits (CrawlConfig.render_timeout)
    timeout: float = 30.0
    # pages rendered at once (PLAYWRIGHT_MAX_PAGES_PER_CONTEXT, one active context at a time)
    concurrency: int = 4
    # browser contexts alive at once: the active one and those retiring (PLAYWRIGHT_MAX_CONTEXTS)
    max_contexts: int = 2
    # a context is replaced after this many pages (its memory, caches and storage go with it)
    recycle_after: int = 50
    # without `wait_for`: after the load event, wait until the page has made no request for
    # `settle_quiet` seconds (its scripts' fetch/XHR answered), at most `settle_seconds`
    settle_quiet: float = 0.3
    settle_seconds: float = 3.0
    # with `wait_for`: wait for the selectors (scrolling down meanwhile) at most this long
    wait_for_seconds: float = 10.0
    # requests one page may make besides its document (scripts, fetch/XHR); the rest are aborted
    max_subresources: int = 50
    # subresources on hosts of other sites (CDNs, analytics...): aborted unless true
    third_party: bool = False
    # V8 heap of a renderer: a page that allocates without end crashes its renderer there
    js_heap_mb: int = 512
    # scripts kept per run (by URL): a site's bundle is fetched once, not once per page
    script_cache_mb: float = 16.0
    # how often the browser's memory is sampled into the statistics (rendered pages)
    memory_sample_every: int = 10

    @classmethod
    def from_mapping(cls, overrides: dict[str, Any] | None, *, timeout: float | None = None):
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        if timeout is not None:
            values["timeout"] = float(timeout)
        for key, value in (overrides or {}).items():
            if key not in known:
                raise ValueError(f"render.{key}: unknown render setting (known: {sorted(known)})")
            values[key] = _convert(key, value, known[key].default)
        config = cls(**values)
        if config.timeout <= 0 or config.concurrency < 1 or config.max_contexts < 1:
            raise ValueError("render: timeout > 0, concurrency >= 1 and max_contexts >= 1")
        if config.recycle_after < 1:
            raise ValueError("render.recycle_after: must be >= 1")
        if min(config.settle_quiet, config.settle_seconds, config.wait_for_seconds) < 0:
            raise ValueError("render: settle_quiet, settle_seconds, wait_for_seconds >= 0")
        if config.max_subresources < 0 or config.js_heap_mb < 64:
            raise ValueError("render: max_subresources >= 0 and js_heap_mb >= 64")
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def env_overrides(cls, environ: Mapping_[str, str] | None = None) -> dict[str, str]:
        """`ENRICH_RENDER_<SETTING>` variables of the environment (e.g. ENRICH_RENDER_CONCURRENCY=2),
        for every setting but `timeout` (the dataset's `crawl.render_timeout`); empty ones ignored."""
        environ = os.environ if environ is None else environ
        out: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            if f.name == "timeout":
                continue
            raw = environ.get(f"{ENV_PREFIX}{f.name.upper()}", "").strip()
            if raw:
                out[f.name] = raw
        return out


ENV_PREFIX = "ENRICH_RENDER_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _convert(key: str, value: Any, default: Any) -> Any:
    """A setting's value (from JSON or an environment variable) as the type of its default."""
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                text = value.strip().lower()
                if text not in _TRUE + _FALSE:
                    raise ValueError("not a boolean")
                return text in _TRUE
            return bool(value)
        if isinstance(default, int):
            number = float(value)
            if number != int(number):
                raise ValueError("not a whole number")
            return int(number)
        if isinstance(default, float):
            return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"render.{key}={value!r}: {exc}") from None
    return value


def render_modes(mappings: Iterable[Mapping]) -> set[str]:
    return {m.render for m in mappings}


def needs_browser(mappings: Iterable[Mapping]) -> bool:
    """Some mapping asks for rendering: the browser handler is installed (and started lazily, at
    the first page that is actually rendered)."""
    return bool(render_modes(mappings) & {"js", "auto"})


@dataclass
class Document:
    """The answer a render starts from: the browser gets it instead of fetching it again."""

    url: str
    status: int
    body: bytes  # UTF-8 (decoded by the HTML rules, re-encoded)
    fetched_at: str | None = None
    content_hash: str | None = None
    content_type: str = "text/html; charset=utf-8"

    @classmethod
    def of_page(cls, page: Page) -> Document:
        return cls(
            url=page.url,
            status=page.status,
            body=page.text.encode("utf-8"),
            fetched_at=page.fetched_at,
            content_hash=page.content_hash,
        )


# -- does the page look built by script? ----------------------------------------------------------

# ids, attributes and elements that single-page-application frameworks mount into
_SPA_ROOT = (
    "//*[@id='root' or @id='app' or @id='__next' or @id='__nuxt' or @id='___gatsby' "
    "or @id='svelte' or @id='main-app' or @ng-app or @ng-version or @data-reactroot "
    "or @data-v-app or @data-server-rendered] | //app-root"
)
_VISIBLE_TEXT = (
    "//body//text()[not(ancestor::script or ancestor::style or ancestor::noscript "
    "or ancestor::template)]"
)
_NOSCRIPT_HINTS = ("javascript", "enable js", "js enabled", "js is disabled")
LITTLE_TEXT = 200  # characters of visible text below which a page with scripts is a shell
SOME_TEXT = 1500  # above this much text, a page is content whatever its scripts


@dataclass
class ScriptBuilt:
    script_built: bool
    signals: list[str]
    text_chars: int = 0
    scripts: int = 0

    def __bool__(self) -> bool:
        return self.script_built


def looks_script_built(page: Page) -> ScriptBuilt:
    """Whether the static HTML looks like a shell that scripts fill in, with the signals seen:
    `little_text` (under LITTLE_TEXT characters of visible text), `spa_root` (an empty mount node
    such as `<div id="root"></div>`), `noscript_hint` (a <noscript> asking for JavaScript),
    `script_heavy` (more inline script than text, or three or more external scripts).

    Script-built: an empty SPA root or a noscript hint (unless the page has plenty of text), or
    little text on a page that has scripts at all, or script-heavy with modest text."""
    tree = page.tree
    if page.kind != "html" or tree is None or not hasattr(tree, "xpath"):
        return ScriptBuilt(False, ["not_html"])
    text_chars = sum(len(t.strip()) for t in tree.xpath(_VISIBLE_TEXT))
    scripts = tree.xpath("//script")
    external = sum(1 for s in scripts if s.get("src"))
    inline_chars = sum(len(s.text or "") for s in scripts if not s.get("src"))
    signals: list[str] = []
    if text_chars < LITTLE_TEXT:
        signals.append("little_text")
    for node in tree.xpath(_SPA_ROOT):
        if not len(node) and not (node.text or "").strip():
            signals.append("spa_root")
            break
    for node in tree.xpath("//noscript"):
        text = node.text_content().lower()
        if any(hint in text for hint in _NOSCRIPT_HINTS):
            signals.append("noscript_hint")
            break
    if scripts and (inline_chars > text_chars or external >= 3):
        signals.append("script_heavy")
    if not scripts:
        built = False  # nothing could build it
    elif text_chars >= SOME_TEXT:
        built = False
    else:
        built = (
            "spa_root" in signals
            or "noscript_hint" in signals
            or "little_text" in signals
            or ("script_heavy" in signals and text_chars < SOME_TEXT // 2)
        )
    return ScriptBuilt(built, signals, text_chars, len(scripts))


def browser_args(config: RenderConfig) -> list[str]:
    """Chromium flags: headless hygiene for a shared 2-core machine (no GPU, no background
    traffic, no updates, no sync), no sandbox (containers), a bounded V8 heap per renderer, and no
    network of its own: every request of a page is answered by the route handler through the
    crawler, so the browser needs no proxy and resolves no name; what Chromium would still send by
    itself (component updates, sign-in checks, under its own user agent) goes nowhere."""
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--dns-prefetch-disable",
        "--no-proxy-server",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--js-flags=--max-old-space-size={int(config.js_heap_mb)}",
    ]


class RenderUrlPolicyMiddleware(UrlPolicyMiddleware):
    """UrlPolicyMiddleware, except for the requests a rendered page makes on other hosts (scripts,
    fetch/XHR, sent through the polite path by the browser handler): those only need to be
    http(s), on no internal address and outside `crawl.deny`. Extensions (`.js`) and the
    huge-sites list are about which pages are worth crawling, not about the parts of a page."""

    def process_request(self, request: Any) -> None:
        if not request.meta.get(SUBRESOURCE):
            return super().process_request(request)
        verdict = self.policy.check(request.url, robots_fetch=True)
        if verdict is None and any(p.search(request.url) for p in self.policy.deny):
            verdict = ("denied", "matches a crawl.deny pattern")
        if verdict is not None:
            reason, detail = verdict
            self.crawler.stats.inc_value(f"enrich/refused_subresource/{reason}")
            raise Refused(reason, detail)
        return None


def playwright_settings(*, chromium: str, config: RenderConfig, user_agent: str) -> dict[str, Any]:
    """The Scrapy settings that install the browser handler (only when `needs_browser`)."""
    handler = "enrich_crawl.crawl.render_handler.RenderDownloadHandler"
    launch: dict[str, Any] = {
        "executable_path": chromium,
        "headless": True,
        "args": browser_args(config),
        "timeout": 30_000,
        # the crawl process decides when the browser stops (SIGTERM of the worker included)
        "handle_sigint": False,
        "handle_sigterm": False,
        "handle_sighup": False,
    }
    return {
        "DOWNLOAD_HANDLERS": {"http": handler, "https": handler},
        "PLAYWRIGHT_BROWSER_TYPE": "chromium",
        "PLAYWRIGHT_LAUNCH_OPTIONS": launch,
        "PLAYWRIGHT_MAX_CONTEXTS": config.max_contexts,
        "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": config.concurrency,
        "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": config.timeout * 1000,
        # fail closed: a browser request that escaped our route handler is aborted
        "PLAYWRIGHT_ABORT_REQUEST": "enrich_crawl.crawl.render_handler.abort_everything",
        "PLAYWRIGHT_RESTART_DISCONNECTED_BROWSER": True,
        "ENRICH_RENDER": config.to_dict(),
        "ENRICH_RENDER_USER_AGENT": user_agent,
    }
