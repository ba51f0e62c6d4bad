"""Build the decision agent's mixed known/world splits. Same as `mmoa-cli data known-split`.

Measures the zero-shot model closed book (greedy, the decision prompt with the answer forced) on
the train and dev parts of the bundled general-knowledge questions; those it answers correctly
are the 'known' group (test: the categories chosen on dev, never measured), mixed with the demo
world's questions (group 'world'). See docs/decision_agent.md.

Example:
  python data_builders/decision_known_split.py \\
      --model_name_or_path models/smollm2-135m-instruct --template smollm2 \\
      --world_dir data/demo --out data/demo_decision
"""

import sys

from mmoa_demo.cli import run_command

if __name__ == "__main__":
    sys.exit(run_command("known-split", sys.argv[1:], prog="decision_known_split.py"))
