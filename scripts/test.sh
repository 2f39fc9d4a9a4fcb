#!/usr/bin/env bash
# The test command of the README (and of CI): lint, then the whole suite against real services.
# Fails on any failure, and also when pytest collects no tests (exit code 5).
# Runs in the environment scripts/setup.sh installed into: the active virtual environment, else
# ./.venv, else (no venv) python3; $PYTHON overrides. Its bin folder goes first on PATH, so the
# commands the tests start (enrich-crawl, dagster, dagster-celery, nx-27017) are the ones installed
# with the package.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    PYTHON="$VIRTUAL_ENV/bin/python"
  elif [ -x .venv/bin/python ]; then
    PYTHON="$PWD/.venv/bin/python"
  else
    PYTHON=python3
  fi
fi
BIN="$(dirname "$(command -v "$PYTHON")")"
export PATH="$BIN:$PATH"
export ENRICH_REQUIRE_SERVICES=1   # a missing service fails the suite instead of skipping tests

"$PYTHON" -m ruff check enrich_crawl enrich_crawl_tests bench || exit 1

"$PYTHON" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
