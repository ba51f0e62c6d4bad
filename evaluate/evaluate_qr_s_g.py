"""Evaluate the QR -> Retriever -> Selector -> Generator pipeline. Same as `mmoa-cli eval`.

Example (from the repository root; relative paths are taken from the current folder):
  python evaluate/evaluate_qr_s_g.py --model_name_or_path saves/smollm2-135m/full/mappo \\
      --template smollm2 --data_file data/demo/test.jsonl --k 5 --output_dir outputs/eval/mappo

Without --model_name_or_path / --output_dir it prints this example and exits; a missing model
or QA file is named with the command that makes it (all logic lives in ``mmoa.cli``).
"""

import sys

try:
    from mmoa.cli import run_script
except ImportError as err:  # not the project's interpreter: say how to get it, not a traceback
    sys.exit(f"evaluate_qr_s_g.py: error: the mmoa package cannot be imported ({err})\n"
             "  make it with: bash setup_env.sh && source .venv/bin/activate "
             "(from the repository root)")

if __name__ == "__main__":
    sys.exit(run_script(["eval"], __file__, sys.argv[1:]))
