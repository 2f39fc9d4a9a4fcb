"""The virtual web's command line (the form :func:`enrich_crawl.virtualweb.running_web` starts)::

python -m enrich_crawl.virtualweb ROOT [--host 127.0.0.1] [--port 0] [--log FILE]
    [--port-file FILE] [--seed N] [--ca-file FILE] [--exit-with-parent] [-v]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from enrich_crawl.virtualweb.server import VirtualWeb

log = logging.getLogger("enrich_crawl.virtualweb")  # also when run as __main__


async def _serve_cli(args: argparse.Namespace) -> None:
    web = VirtualWeb(
        args.root,
        host=args.host,
        port=args.port,
        log_path=args.log,
        seed=args.seed,
        idle_timeout=args.idle_timeout,
    )
    await web.start()
    if args.ca_file:
        Path(args.ca_file).write_bytes(web.ca_pem)
    if args.port_file:
        tmp = Path(f"{args.port_file}.tmp")
        tmp.write_text(str(web.port))
        os.replace(tmp, args.port_file)
    print(f"listening on http://{args.host}:{web.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = None
    if args.exit_with_parent:
        parent = os.getppid()

        async def watch() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(0.5)
            log.warning("parent process gone: stopping")
            stop.set()

        watcher = asyncio.ensure_future(watch())
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await web.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m enrich_crawl.virtualweb",
        description="Serve ROOT/<hostname>/... as a virtual web (HTTP server and forward proxy).",
    )
    parser.add_argument("root", help="folder of host folders")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    parser.add_argument("--log", help="request log file (JSON lines)")
    parser.add_argument("--port-file", help="write the port to this file once listening")
    parser.add_argument("--seed", type=int, default=None, help="latency seed")
    parser.add_argument("--ca-file", help="write the CA certificate (PEM) to this file")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=120.0,
        help="close keep-alive connections idle this long, in seconds (Apache's default: 5)",
    )
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the parent process dies"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more on stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve_cli(args))
    else:
        uvloop.run(_serve_cli(args))
    return 0
