"""Generate the demo world (corpus + QA splits). Same as `mmoa-cli data demo-world`.

Example: python data_builders/make_demo_world.py --out data/demo --n-passages 2000 --seed 42
"""

import sys

from mmoa_demo.cli import run_command

if __name__ == "__main__":
    sys.exit(run_command("demo-world", sys.argv[1:], prog="make_demo_world.py"))
