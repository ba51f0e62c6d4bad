"""Build the MAPPO prompt set (questions + all gold answers). Same as `mmoa-cli data mappo`.

Example:
  python data_builders/get_ppo_data_alpaca.py --data_file data/demo/train.jsonl --name demo_mappo
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "mappo", *sys.argv[1:]]))
