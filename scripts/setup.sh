#!/usr/bin/env bash
# Set up enrich_crawl on a fresh Debian/Ubuntu machine: system packages (Chromium for JavaScript
# pages, PostgreSQL and Redis for the tests and the multi-machine setup), then the Python package
# with its development extras. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$PYTHON" -m pip install -q -e ".[dev]"

# The Python-docs corpus of the extraction tests and benchmarks (Debian's python3.11-doc, 12 MB),
# cached under ${ENRICH_CACHE:-~/.cache/enrich_crawl}; apt-get download needs fresh package lists.
if ! "$PYTHON" -m enrich_crawl.testing.pydocs fetch >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq || true
  "$PYTHON" -m enrich_crawl.testing.pydocs fetch >/dev/null \
    || echo "setup: warning: could not fetch the Python-docs corpus (python3.11-doc)" >&2
fi
echo "setup: done ($("$PYTHON" -c 'import dagster, scrapy; print("dagster", dagster.__version__, "scrapy", scrapy.__version__)'))"
