"""``python -m arrowstream``: the command line."""

import sys

from arrowstream.cli import main

if __name__ == "__main__":
    sys.exit(main())
