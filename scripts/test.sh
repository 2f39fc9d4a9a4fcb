#!/usr/bin/env bash
# The test command of the README (and of CI): lint, then the whole suite against real services.
# Fails on any failure, and also when pytest collects no tests (exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export ENRICH_REQUIRE_SERVICES=1   # a missing service fails the suite instead of skipping tests

"$PYTHON" -m ruff check enrich_crawl enrich_crawl_tests bench || exit 1

"$PYTHON" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
