"""The virtual web: a loopback HTTP/HTTPS server and forward proxy that serves many hostnames from
a folder (ROOT/<hostname>/...). A runtime feature (the `virtual_web` key of a dataset spec, the
demo, the benchmarks) as much as a test fixture. Rooms: server (VirtualWeb), http1 (requests on
the wire), content (the file that answers, bodies), config (per-host `_web.json`), tls (CONNECT
interception), requestlog, process (running_web), cli (`python -m enrich_crawl.virtualweb`).
"""

from enrich_crawl.virtualweb.cli import main
from enrich_crawl.virtualweb.config import HostConfig
from enrich_crawl.virtualweb.content import guess_content_type
from enrich_crawl.virtualweb.http1 import normalize_host
from enrich_crawl.virtualweb.process import WebHandle, running_web
from enrich_crawl.virtualweb.requestlog import read_log, requests_by_host
from enrich_crawl.virtualweb.server import VirtualWeb

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
