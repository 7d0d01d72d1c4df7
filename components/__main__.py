"""`python -m components <command>`: the operator's tools (components/tools/cli.py)."""

import sys

from components.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
