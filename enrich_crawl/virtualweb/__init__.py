"""The virtual web: a loopback HTTP/HTTPS server and forward proxy that serves many hostnames from
a folder (ROOT/<hostname>/...). A runtime feature (the `virtual_web` key of a dataset spec, the
demo, the benchmarks) as much as a test fixture: see enrich_crawl.virtualweb.server.

    python -m enrich_crawl.virtualweb ROOT [--host 127.0.0.1] [--port 0] [--log FILE]
"""

from enrich_crawl.virtualweb.server import (
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
