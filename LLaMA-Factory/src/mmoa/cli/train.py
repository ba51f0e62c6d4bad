"""``mmoa-cli train`` and ``mmoa-cli export``: a LLaMA-Factory config, checked before it runs."""

from __future__ import annotations

import argparse

from mmoa.cli.common import Commands, with_config_errors


def _cmd_train(args: argparse.Namespace) -> int:
    from mmoa.train.launcher import run_train

    return with_config_errors("train", lambda: run_train([args.config, *args.overrides]))


def _cmd_export(args: argparse.Namespace) -> int:
    from mmoa.preflight import check_export_config
    from mmoa.train.launcher import read_train_config, run_llamafactory

    argv = [args.config, *args.overrides]

    def run() -> int:
        check_export_config(read_train_config(argv))
        return run_llamafactory("export", argv)

    return with_config_errors("export", run)


def add_train_command(commands: Commands) -> None:
    train = commands.add_parser(
        "train",
        help="train: stages mappo and retriever_rl are ours, every other stage runs "
             "llamafactory-cli train",
        description=(
            "Train from a LLaMA-Factory YAML/JSON config. 'stage: mappo' runs the multi-agent "
            "PPO stage of this project, 'stage: retriever_rl' trains the retriever's query "
            "encoder with GRPO on sampled retrievals (docs/retriever_rl.md); any other stage "
            "is exactly 'llamafactory-cli train'."
        ),
        epilog=(
            "examples:\n"
            "  mmoa-cli train LLaMA-Factory/examples/demo/tiny_full_sft.yaml\n"
            "  mmoa-cli train LLaMA-Factory/examples/demo/smollm2_retriever_rl.yaml\n"
            "  mmoa-cli train LLaMA-Factory/examples/demo/tiny_full_sft.yaml "
            "num_train_epochs=1 output_dir=saves/try"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("config", help="YAML or JSON config file")
    train.add_argument("overrides", nargs="*", help="key=value overrides (as llamafactory-cli)")
    train.set_defaults(handler=_cmd_train)


def add_export_command(commands: Commands) -> None:
    export = commands.add_parser(
        "export",
        help="merge a LoRA adapter into its base model (llamafactory-cli export)",
        description=("Merge a LoRA adapter into its base model and save the result to\n"
                     "export_dir: exactly 'llamafactory-cli export', after checking that the\n"
                     "model and adapter folders exist."),
        epilog=(
            "examples:\n"
            "  mmoa-cli export LLaMA-Factory/examples/real/llama3_lora_sft_merge.yaml\n"
            "  mmoa-cli export LLaMA-Factory/examples/real/llama3_lora_sft_merge.yaml "
            "export_dir=models/merged"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("config", help="YAML config with model, adapter and export_dir")
    export.add_argument("overrides", nargs="*", help="key=value overrides")
    export.set_defaults(handler=_cmd_export)
