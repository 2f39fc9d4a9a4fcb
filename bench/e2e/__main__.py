"""``python -m bench.e2e [options]``: the same as ``python -m bench e2e [options]``."""

import sys

from bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["e2e", *sys.argv[1:]]))
