"""``python -m mmoa_demo <command>``: the demo's data builders without ``mmoa-cli``."""

import sys

from mmoa_demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
