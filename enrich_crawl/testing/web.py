"""The virtual web moved to enrich_crawl.virtualweb (a runtime feature behind the `virtual_web`
spec key, not a test helper); this name keeps working for tests and `python -m` users."""

import sys

from enrich_crawl.virtualweb import (
    HostConfig,
    VirtualWeb,
    WebHandle,
    guess_content_type,
    main,
    normalize_host,
    read_log,
    requests_by_host,
    running_web,
)

__all__ = [
    "HostConfig",
    "VirtualWeb",
    "WebHandle",
    "guess_content_type",
    "main",
    "normalize_host",
    "read_log",
    "requests_by_host",
    "running_web",
]

if __name__ == "__main__":
    sys.exit(main())
