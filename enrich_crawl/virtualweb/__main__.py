"""python -m enrich_crawl.virtualweb ROOT ...: serve a virtual web (see enrich_crawl.virtualweb)."""

import sys

from enrich_crawl.virtualweb.cli import main

sys.exit(main())
