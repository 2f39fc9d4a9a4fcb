"""The seed blog's crawler, as a baseline: one process per shard, sequential ``requests`` + lxml.

For each record in turn: a depth-limited breadth-first crawl from its seed URLs that follows every
link of each page *on the same host* up to the depth, and runs the dataset's mappings (the product's
extraction engine) on every page it fetches; the first value found for a missing field wins.

Why same-host links only: a naive crawler that followed every link would spend most of its pages on
social networks and other sites that cannot hold the record's fields (and the benchmark web has no
such sites); restricting to the host is what the seed story's crawler did with ``allowed_domains`` and
is the charitable choice, so the comparison with the product is conservative.

Politeness, the same as the product: robots.txt (RFC 9309: 4xx allow all, 5xx/unreachable disallow
all) fetched before any other path of a host, Crawl-delay honoured (default 1 s) counted from the
previous answer to the next request, redirects followed one polite request at a time, one request at
a time per host across all processes (``--lock-dir``: one file per host, locked while a process
waits for its turn and fetches, holding the time of the host's last answer), retries with backoff
on 5xx/429/timeouts, 30 s timeout. No cache across records beyond robots.txt (the seed crawler had
none): each record's crawl stands alone.

    python -m bench.e2e.baseline_seed --spec SPEC --mappings DIR --shard I --shards P \
        --out results.jsonl [--proxy URL --ca FILE --budget SECONDS --depth 2 --lock-dir DIR]

Writes one JSON line per finished record (``{"record", "fields", "pages", "errors", "seconds"}``)
and prints final statistics as JSON on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import requests
import urllib3

from bench.e2e.common import (
    DEFAULT_DELAY,
    RETRY_CODES,
    SEED_UA,
    Extractor,
    RecordResult,
    RobotsRules,
    host_key,
    load_records,
    naive_links,
    records_of_shard,
    robots_url,
)
from enrich_crawl.extract import Page
from enrich_crawl.urls import fragment_of, without_fragment

MAX_REDIRECTS = 5


class PoliteSession:
    """Sequential fetching with robots.txt and per-host delays."""

    def __init__(
        self,
        *,
        proxy: str | None,
        ca: str | None,
        user_agent: str = SEED_UA,
        default_delay: float = DEFAULT_DELAY,
        timeout: float = 30.0,
        retries: int = 2,
        lock_dir: Path | None = None,
    ):
        self.session = requests.Session()
        self.session.headers["User-Agent"] = user_agent
        if proxy:
            self.session.proxies = {"http": proxy, "https": proxy}
            self.session.trust_env = False
        self.session.verify = ca if ca else False
        if not ca:
            urllib3.disable_warnings()
        self.user_agent = user_agent
        self.default_delay = default_delay
        self.timeout = timeout
        self.retries = retries
        self.robots: dict[str, RobotsRules] = {}
        self.delays: dict[str, float] = {}
        self.last: dict[str, float] = {}  # host -> epoch time of its last answer (this process)
        self.lock_dir = lock_dir
        if lock_dir is not None:
            lock_dir.mkdir(parents=True, exist_ok=True)
        self.requests = 0

    @contextlib.contextmanager
    def _turn(self, host: str) -> Iterator[None]:
        """The host's turn: its delay after its last answer (of any process sharing lock_dir),
        and no other request to it until this one is answered."""
        delay = self.delays.get(host, self.default_delay)
        fd = None
        last = self.last.get(host)
        if self.lock_dir is not None:
            fd = os.open(self.lock_dir / f"{host}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            text = os.pread(fd, 64, 0).strip()
            last = float(text) if text else None
        try:
            if last is not None:
                pause = last + delay - time.time()
                if pause > 0:
                    time.sleep(pause)
            yield
        finally:
            answered = time.time()
            self.last[host] = answered
            if fd is not None:
                os.ftruncate(fd, 0)
                os.pwrite(fd, repr(answered).encode(), 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _send(self, url: str) -> requests.Response | None:
        """One GET, redirects followed one polite request at a time (robots.txt of a new host
        first); None when no answer came."""
        response = None
        for _hop in range(MAX_REDIRECTS + 1):
            with self._turn(host_key(url)):
                self.requests += 1
                try:
                    response = self.session.get(url, timeout=self.timeout, allow_redirects=False)
                except requests.RequestException:
                    return None
            location = response.headers.get("Location") if response.is_redirect else None
            if not location:
                return response
            url = urljoin(url, location)
            if not url.endswith("/robots.txt") and not self.rules(url).allowed(
                url, self.user_agent
            ):
                return response
        return response

    def _get(self, url: str) -> requests.Response | None:
        """One polite GET with retries; None when no answer came."""
        for attempt in range(self.retries + 1):
            response = self._send(url)
            if response is not None and response.status_code not in RETRY_CODES:
                return response
            if attempt < self.retries:
                time.sleep(min(2**attempt, 4))
        return response

    def rules(self, url: str) -> RobotsRules:
        host = host_key(url)
        rules = self.robots.get(host)
        if rules is None:
            response = self._get(robots_url(url))
            if response is None:
                rules = RobotsRules.from_response(None, b"")
            else:
                rules = RobotsRules.from_response(response.status_code, response.content)
            self.robots[host] = rules
            self.delays[host] = rules.delay(self.user_agent, self.default_delay)
        return rules

    def fetch(self, url: str) -> tuple[requests.Response | None, str]:
        """(response, "") or (None|response, reason)."""
        if not self.rules(url).allowed(url, self.user_agent):
            return None, "robots"
        response = self._get(url)
        if response is None:
            return None, "no_answer"
        if response.status_code >= 400:
            return response, f"http_{response.status_code}"
        return response, ""


def crawl_record(
    record, session: PoliteSession, extractor: Extractor, depth: int, deadline: float
) -> RecordResult | None:
    """Breadth-first to ``depth`` from the record's seeds; None when the deadline cut it short."""
    result = RecordResult(record.id, record.missing)
    needed = set(record.missing)
    queue: deque[tuple[str, int, str]] = deque()
    seen: set[str] = set()
    for seed in record.urls:
        key = without_fragment(seed)
        if key not in seen:
            seen.add(key)
            queue.append((key, 0, fragment_of(seed)))
    while queue:
        if time.monotonic() > deadline:
            return None
        url, level, fragment = queue.popleft()
        response, reason = session.fetch(url)
        if reason == "robots":
            result.errors.append({"url": url, "reason": reason})
            continue
        result.pages += 1
        if reason:
            result.errors.append({"url": url, "reason": reason})
            continue
        page = Page(
            response.url,
            response.content,
            content_type=response.headers.get("Content-Type"),
            status=response.status_code,
        )
        wanted = needed - set(result.fields)
        if wanted:
            found = extractor.extract(page, fragment=fragment, record_id=record.id, wanted=wanted)
            for name, value in found.items():
                result.fields.setdefault(name, value)
        if level < depth:
            for link in naive_links(page):
                if link not in seen:
                    seen.add(link)
                    queue.append((link, level + 1, ""))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--mappings", required=True)
    parser.add_argument("--shard", type=int, required=True, help="shard index (0-based)")
    parser.add_argument("--shards", type=int, required=True, help="number of shards/processes")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--proxy", default=None)
    parser.add_argument("--ca", default=None, help="CA certificate of the virtual web (https)")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.0, help="seconds (0: no limit)")
    parser.add_argument(
        "--max-records", type=int, default=0, help="crawl only the shard's first N records (0: all)"
    )
    parser.add_argument("--default-delay", type=float, default=DEFAULT_DELAY)
    parser.add_argument(
        "--lock-dir", type=Path, default=None, help="per-host turns shared by all processes"
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    records, field_types = load_records(args.spec)
    mine = records_of_shard(records, args.shard, args.shards)
    if args.max_records > 0:  # records are in random order (the generator shuffles them)
        mine = mine[: args.max_records]
    extractor = Extractor(args.mappings, field_types)
    session = PoliteSession(
        proxy=args.proxy, ca=args.ca, default_delay=args.default_delay, lock_dir=args.lock_dir
    )
    deadline = started + args.budget if args.budget > 0 else float("inf")
    done = pages = 0
    cut = False
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out:
        for record in mine:
            if time.monotonic() > deadline:
                cut = True
                break
            result = crawl_record(record, session, extractor, args.depth, deadline)
            if result is None:
                cut = True
                break
            out.write(result.line() + "\n")
            out.flush()
            done += 1
            pages += result.pages
    print(
        json.dumps(
            {
                "shard": args.shard,
                "records_total": len(mine),
                "records_done": done,
                "pages": pages,
                "requests": session.requests,
                "budget_hit": cut,
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
