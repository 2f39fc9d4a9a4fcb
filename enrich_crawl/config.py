"""Every environment variable and crawl default of enrich_crawl, parsed in one place.

docs/configuration.md lists the public variables; the crawl defaults can be overridden per dataset
(`crawl:` in the dataset spec). Nothing here imports Dagster or Scrapy.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enrich_crawl.suggest import did_you_mean

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent

DEFAULT_USER_AGENT = (
    "enrich_crawl/0.1 (+https://github.com/enrich-crawl/enrich_crawl/blob/main/docs/CRAWLER.md)"
)
DEFAULT_DB = "enrich_crawl"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_SHARDS = 8


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def user_agent() -> str:
    """The crawler identity (ENRICH_USER_AGENT); it must carry a URL explaining the crawler."""
    ua = os.environ.get("ENRICH_USER_AGENT", "").strip()
    if not ua:
        return DEFAULT_USER_AGENT
    if "http://" not in ua and "https://" not in ua:
        raise ValueError(
            f"ENRICH_USER_AGENT={ua!r} must carry a URL that explains the crawler "
            "(e.g. 'mybot/1.0 (+https://example.org/bot.html)')"
        )
    return ua


def allow_private() -> bool:
    return env_flag("ENRICH_ALLOW_PRIVATE")


def chromium_path() -> str:
    return os.environ.get("ENRICH_CHROMIUM") or DEFAULT_CHROMIUM


def crawl_allocator() -> str:
    """The crawl workers' memory allocator: `auto` (jemalloc when installed), `system`, or the path
    of a malloc library to preload (enrich_crawl.crawl.allocator)."""
    return os.environ.get("ENRICH_CRAWL_ALLOCATOR", "").strip() or "auto"


def http_proxy() -> str | None:
    return os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY") or None


def https_proxy() -> str | None:
    return os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY") or http_proxy()


def proxy_urls() -> list[str]:
    """Every proxy the environment names (either spelling of http_proxy and https_proxy)."""
    names = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
    return [value for value in (os.environ.get(name) for name in names) if value]


def mongodb_uri() -> str | None:
    """MONGODB_URI: the results database (None: not set)."""
    return os.environ.get("MONGODB_URI") or None


def mongodb_db() -> str:
    """MONGODB_DB: the results database's name (default enrich_crawl)."""
    return os.environ.get("MONGODB_DB") or DEFAULT_DB


def datasets_dir() -> Path | None:
    """ENRICH_DATASETS_DIR: the folder of dataset specs the sensor watches (None: not set)."""
    raw = os.environ.get("ENRICH_DATASETS_DIR", "").strip()
    return Path(raw).expanduser().resolve() if raw else None


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None


def run_time_budget() -> float | None:
    """ENRICH_RUN_TIME_BUDGET: seconds after which a run's crawls stop cleanly (None: no budget)."""
    raw = os.environ.get("ENRICH_RUN_TIME_BUDGET", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"ENRICH_RUN_TIME_BUDGET={raw!r} is not a number of seconds") from exc
    return value if value > 0 else None


def min_resolution_rate() -> float:
    """ENRICH_MIN_RESOLUTION_RATE: the resolution_rate check's threshold (default 0.5)."""
    raw = os.environ.get("ENRICH_MIN_RESOLUTION_RATE", "").strip()
    return float(raw) if raw else 0.5


def max_parallel() -> int:
    """ENRICH_MAX_PARALLEL: crawl steps at once in one run (multiprocess executor; default 8)."""
    raw = os.environ.get("ENRICH_MAX_PARALLEL", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 8


EXECUTORS = ("multiprocess", "celery", "in_process")


def executor_kind() -> str:
    """ENRICH_EXECUTOR: multiprocess (default), celery or in_process."""
    kind = os.environ.get("ENRICH_EXECUTOR", "multiprocess").strip().lower()
    if kind not in EXECUTORS:
        raise ValueError(f"ENRICH_EXECUTOR={kind!r}: use multiprocess, celery or in_process")
    return kind


def crawl_retries() -> int:
    """ENRICH_CRAWL_RETRIES: retries of a failed crawl step (default 2)."""
    raw = os.environ.get("ENRICH_CRAWL_RETRIES", "").strip()
    return int(raw) if raw else 2


def crawl_retry_delay() -> float:
    """ENRICH_CRAWL_RETRY_DELAY: seconds before a crawl step's first retry (default 10)."""
    raw = os.environ.get("ENRICH_CRAWL_RETRY_DELAY", "").strip()
    return float(raw) if raw else 10.0


def schedule_cron() -> str:
    """ENRICH_SCHEDULE_CRON: when nightly_enrich runs (default every night at 02:00)."""
    return os.environ.get("ENRICH_SCHEDULE_CRON", "").strip() or "0 2 * * *"


def schedule_timezone() -> str:
    """ENRICH_SCHEDULE_TZ: the timezone of ENRICH_SCHEDULE_CRON (default UTC)."""
    return os.environ.get("ENRICH_SCHEDULE_TZ", "").strip() or "UTC"


def schedule_running() -> bool:
    """ENRICH_SCHEDULE_RUNNING: nightly_enrich on by default (default off)."""
    return env_flag("ENRICH_SCHEDULE_RUNNING")


def run_dead_after() -> float | None:
    """ENRICH_RUN_DEAD_AFTER: seconds without a heartbeat after which a run is dead (None: not
    set; enrich_crawl.recovery has the default and the floor)."""
    raw = os.environ.get("ENRICH_RUN_DEAD_AFTER", "").strip()
    return _seconds("ENRICH_RUN_DEAD_AFTER", 0.0) if raw else None


def worker_lost_seconds() -> float:
    """ENRICH_WORKER_LOST_SECONDS: a Celery worker silent this long is lost (default 60)."""
    return _seconds("ENRICH_WORKER_LOST_SECONDS", 60.0)


def worker_ping_seconds() -> float:
    """ENRICH_WORKER_PING_SECONDS: how often the run pings the workers of its steps (default 10)."""
    return _seconds("ENRICH_WORKER_PING_SECONDS", 10.0)


def lost_step_retries() -> int:
    """ENRICH_LOST_STEP_RETRIES: retries of a lost worker's step beyond its policy (default 1)."""
    return int(_seconds("ENRICH_LOST_STEP_RETRIES", 1))


def shard_count() -> int:
    raw = os.environ.get("ENRICH_SHARDS", "").strip()
    if not raw:
        return DEFAULT_SHARDS
    try:
        count = int(raw)
    except ValueError as exc:
        raise ValueError(f"ENRICH_SHARDS={raw!r} is not an integer") from exc
    if not 1 <= count <= 4096:
        raise ValueError(f"ENRICH_SHARDS={count} must be between 1 and 4096")
    return count


def crawl_processes(shards: int) -> int:
    """ENRICH_CRAWL_PROCESSES: the crawl processes (crawl steps) one run's `shards` are dealt out
    into, several shards' crawls in one process when there are fewer processes than shards.
    Default: the machine's cores with the local executors (a crawl process's own CPU grows with
    the number of processes, not with their shards: docs/performance.md), one per shard with
    Celery (its steps spread over the machines). `0`: one per shard."""
    raw = os.environ.get("ENRICH_CRAWL_PROCESSES", "").strip()
    if not raw:
        wanted = 0 if executor_kind() == "celery" else (os.cpu_count() or 1)
    else:
        try:
            wanted = int(raw)
        except ValueError as exc:
            raise ValueError(f"ENRICH_CRAWL_PROCESSES={raw!r} is not an integer") from exc
        if wanted < 0:
            raise ValueError(f"ENRICH_CRAWL_PROCESSES={wanted} must be 0 (one per shard) or more")
    return processes_for(wanted, shards)


def processes_for(wanted: int, shards: int) -> int:
    """The crawl processes of a run of `shards` shards when `wanted` are asked for (0: one per
    shard; never more than the shards)."""
    if wanted < 0:
        raise ValueError(f"crawl processes: {wanted} must be 0 (one per shard) or more")
    return shards if wanted == 0 else max(1, min(wanted, shards))


def mappings_dir() -> Path:
    """ENRICH_MAPPINGS, else ./mappings when it exists, else the mappings bundled with the repo."""
    raw = os.environ.get("ENRICH_MAPPINGS")
    if raw:
        return Path(raw).expanduser().resolve()
    local = Path.cwd() / "mappings"
    if local.is_dir():
        return local.resolve()
    return REPO_DIR / "mappings"


def default_dataset_spec() -> Path:
    raw = os.environ.get("ENRICH_DATASET")
    if raw:
        return Path(raw).expanduser().resolve()
    from enrich_crawl.demo import DEMO_SPEC

    return DEMO_SPEC


def dagster_home() -> Path | None:
    raw = os.environ.get("DAGSTER_HOME")
    return Path(raw).expanduser().resolve() if raw else None


def default_home() -> Path:
    """The per-user home used when DAGSTER_HOME is unset: `$XDG_DATA_HOME/enrich_crawl`
    (`~/.local/share/enrich_crawl`). One place whatever the working folder, so runs started from
    any folder share one Dagster instance, one staging area and one embedded MongoDB."""
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return (base / "enrich_crawl").resolve()


def home() -> Path:
    """The home of the Dagster instance: DAGSTER_HOME, else the per-user default."""
    return dagster_home() or default_home()


def work_dir() -> Path:
    """The staging area (ENRICH_WORK_DIR, default <home>/storage/enrich_crawl)."""
    raw = os.environ.get("ENRICH_WORK_DIR")
    if raw:
        return Path(raw).expanduser().resolve()
    return home() / "storage" / "enrich_crawl"


def work_dir_given() -> bool:
    """ENRICH_WORK_DIR is set (a printed command must carry it to reach the same staging area)."""
    return bool(os.environ.get("ENRICH_WORK_DIR"))


def use_home(path: Path) -> None:
    """Make `path` this process's home, and its children's (DAGSTER_HOME)."""
    os.environ["DAGSTER_HOME"] = str(path)


def dagster_env_prefix() -> str:
    """What a printed `dagster ...` command needs in front to act on this home from any folder
    (without DAGSTER_HOME, Dagster would use a temporary instance there)."""
    import shlex

    prefix = f"DAGSTER_HOME={shlex.quote(str(home()))} "
    if work_dir_given():
        prefix += f"ENRICH_WORK_DIR={shlex.quote(str(work_dir()))} "
    return prefix


# the PostgreSQL settings of the Dagster instance: all of them, or none
POSTGRES_VARIABLES = (
    "DAGSTER_PG_HOST",
    "DAGSTER_PG_PORT",
    "DAGSTER_PG_USER",
    "DAGSTER_PG_PASSWORD",
    "DAGSTER_PG_DB",
)


def postgres_settings() -> dict[str, str] | None:
    """The DAGSTER_PG_* settings when any is set (the instance then uses PostgreSQL), else None.
    Raises ValueError naming the missing variables when only some are set."""
    values = {name: os.environ.get(name, "") for name in POSTGRES_VARIABLES}
    if not any(value.strip() for value in values.values()):
        return None
    # an empty password is legitimate (trust authentication); the others are not
    missing = [n for n, v in values.items() if not v.strip() and n != "DAGSTER_PG_PASSWORD"]
    if missing:
        raise ValueError(
            f"DAGSTER_PG_* is partly set: {', '.join(missing)} missing (set all of "
            f"{', '.join(POSTGRES_VARIABLES)} to use PostgreSQL, or none for the local default)"
        )
    return values


@dataclass(frozen=True)
class CrawlConfig:
    """Crawl defaults (docs/configuration.md), overridable per dataset with its `crawl:` section.

    docs/configuration.md documents every key; enrich_crawl.crawl.settings turns them
    into Scrapy settings.
    """

    depth: int = 1
    allowed_domains: tuple[str, ...] = ()
    # regexes on absolute URLs; a URL must match one `allow` (when any) and no `deny`
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    # follow outbound links that no url_parser selected (generic following), after parser links
    follow_all_links: bool = False
    # seconds between two requests to one host when robots.txt gives no Crawl-delay
    default_delay: float = 1.0
    max_delay: float = 60.0  # cap of any delay (a Crawl-delay of a day would stall the host)
    autothrottle: bool = True
    concurrent_requests: int = 128  # downloads in flight per crawl process (all hosts)
    download_timeout: float = 30.0
    max_page_bytes: int = 10 * 1024 * 1024
    retries: int = 2  # transient failures only (5xx, 408, 429, timeouts, resets)
    retry_backoff: float = 2.0  # first retry waits this long (or the host delay), then doubles
    retry_backoff_max: float = 120.0
    robots_ttl_hours: float = 24.0
    # pages fetched (and record fields resolved) less than this long ago are not fetched again;
    # 20 h: a nightly run refetches, a re-run the same day does not
    recrawl_ttl_hours: float = 20.0
    max_pages_per_record: int = 50
    time_budget_seconds: float = 0.0  # 0: no budget
    deny_domains: tuple[str, ...] = ()  # on top of the huge-sites list
    deny_extensions: tuple[str, ...] = ()  # empty: the built-in list of binaries/documents/media
    # skip the huge sites of enrich_crawl/data/huge_sites.txt (or `huge_sites_file`) unless a
    # mapping claims the URL
    huge_sites: bool = True
    huge_sites_file: str = ""
    render_timeout: float = 30.0
    # one shared per-host limiter in the results database for all crawl processes
    shared_limiter: bool = True
    # persist pages that fed a mapping (compressed) so later runs re-extract without fetching,
    # and revalidate them with ETag / If-Modified-Since once stale
    store_pages: bool = True
    max_stored_page_bytes: int = 2 * 1024 * 1024
    # pages of this run kept in memory per crawl process; more spill to a local scratch file
    page_cache_mb: float = 32.0
    # `goal` (default): stop a record when its fields are found; `bfs`: plain breadth-first crawl
    # of every link to `depth` (for comparisons only)
    strategy: str = "goal"

    @classmethod
    def from_mapping(cls, overrides: dict[str, Any] | None, *, where: str = "crawl") -> CrawlConfig:
        """Build from a dataset's `crawl:` section; unknown keys or bad types raise ValueError."""
        if not overrides:
            return cls()
        if not isinstance(overrides, dict):
            raise ValueError(f"{where}: must be a mapping, got {type(overrides).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(
                    f"{where}.{key}: unknown crawl setting (known: {', '.join(sorted(known))})"
                    + did_you_mean(key, known)
                )
            default = known[key].default
            try:
                if isinstance(default, bool):
                    if not isinstance(value, bool):
                        raise TypeError("expected true or false")
                elif isinstance(default, int):
                    if isinstance(value, bool) or int(value) != value:
                        raise TypeError("expected an integer")
                    value = int(value)
                elif isinstance(default, float):
                    if isinstance(value, bool):
                        raise TypeError("expected a number")
                    value = float(value)
                elif isinstance(default, str):
                    if not isinstance(value, str):
                        raise TypeError("expected a string")
                elif isinstance(default, tuple):
                    if isinstance(value, str):
                        value = [value]
                    if not isinstance(value, (list, tuple)) or not all(
                        isinstance(v, str) for v in value
                    ):
                        raise TypeError("expected a list of strings")
                    value = tuple(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}.{key}: {exc} (got {value!r})") from exc
            values[key] = value
        config = cls(**values)
        config.validate(where)
        return config

    def validate(self, where: str = "crawl") -> None:
        """Raise ValueError naming the key for values that cannot work."""
        import re

        if self.depth < 0 or self.depth > 10:
            raise ValueError(f"{where}.depth: must be between 0 and 10 (got {self.depth})")
        for key in ("default_delay", "max_delay", "retry_backoff", "retry_backoff_max"):
            if getattr(self, key) < 0:
                raise ValueError(f"{where}.{key}: must be >= 0 (got {getattr(self, key)})")
        for key in ("download_timeout", "concurrent_requests", "max_page_bytes"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{where}.{key}: must be > 0 (got {getattr(self, key)})")
        if self.retries < 0 or self.max_pages_per_record < 1:
            raise ValueError(f"{where}: retries must be >= 0 and max_pages_per_record >= 1")
        if self.strategy not in ("goal", "bfs"):
            raise ValueError(f"{where}.strategy: must be 'goal' or 'bfs' (got {self.strategy!r})")
        for key in ("allow", "deny"):
            for pattern in getattr(self, key):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"{where}.{key}: invalid regex {pattern!r}: {exc}") from None
        if self.huge_sites_file and not Path(self.huge_sites_file).expanduser().is_file():
            raise ValueError(f"{where}.huge_sites_file: no such file {self.huge_sites_file!r}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


@dataclass(frozen=True)
class Environment:
    """A snapshot of the environment a crawl worker needs (passed explicitly to subprocesses)."""

    user_agent: str = field(default_factory=user_agent)
    allow_private: bool = field(default_factory=allow_private)
    http_proxy: str | None = field(default_factory=http_proxy)
    https_proxy: str | None = field(default_factory=https_proxy)
    chromium: str = field(default_factory=chromium_path)
