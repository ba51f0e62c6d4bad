"""The structure of ``mmoa-cli`` (issue 45, item 4): options generated from the config
dataclasses, each declared once; the demo's builders a plugin, never imported by the library."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from mmoa.cli import build_parser, main
from mmoa.cli.options import (
    FIELD_DEFAULT,
    Option,
    add_config_options,
    config_from_args,
    unmatched_options,
)

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "LLaMA-Factory" / "src" / "mmoa"


def _sub(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in path:
        parser = next(a for a in parser._actions
                      if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def test_every_config_field_has_its_option_and_no_option_is_stale() -> None:
    """A field added to (or renamed in) a config is found here, not by a user reading a plain
    generated help text."""
    from mmoa.cli import data as data_cli
    from mmoa.cli.eval import eval_options
    from mmoa.data.decision_agent_sft import DecisionSFTConfig
    from mmoa.data.search_agent_sft import SearchSFTConfig
    from mmoa.data.sft_builder import SFTBuildConfig
    from mmoa.evaluation import EvalConfig

    excluded = ("dataset_dir", "request_size")
    for config, options, exclude in (
            (EvalConfig, eval_options(), ()),
            (SFTBuildConfig, data_cli.SFT_OPTIONS, excluded),
            (SearchSFTConfig, data_cli.SEARCH_SFT_OPTIONS, excluded),
            (DecisionSFTConfig, data_cli.DECISION_SFT_OPTIONS, excluded)):
        assert unmatched_options(config, options, exclude) == ([], []), config.__name__


def test_the_eval_options_are_the_config_with_its_defaults() -> None:
    """Every ``EvalConfig`` field is an option of ``mmoa-cli eval``, and the options left out
    make the config's defaults."""
    from mmoa.cli.eval import eval_options
    from mmoa.evaluation import EvalConfig

    parser = _sub("eval")
    options = {s for a in parser._actions for s in a.option_strings}
    for field in dataclasses.fields(EvalConfig):
        assert f"--{field.name}" in options, field.name
    args = build_parser().parse_args(["eval", "--model_name_or_path", "m", "--output_dir", "o",
                                      "--data_file", "f"])
    config = config_from_args(EvalConfig, args, eval_options())
    assert config == EvalConfig(model_name_or_path="m", template="llama3", output_dir="o",
                                data_file="f")
    help_text = parser.format_help()
    assert f"(default {EvalConfig.search_top_k})" in help_text, "defaults shown from the config"


def test_the_two_trajectory_builders_share_one_parser_shape() -> None:
    search, decision = _sub("data", "search-sft"), _sub("data", "decision-sft")
    common = {"--data_file", "--dataset", "--dataset_dir", "--retriever_url", "--name",
              "--top_k", "--no_segment", "--keep_unsupported"}
    for parser in (search, decision):
        assert common <= set(parser._option_string_actions)
    args = build_parser().parse_args(["data", "search-sft", "--no_segment", "--top_k", "2"])
    from mmoa.cli.data import SEARCH_SFT_OPTIONS
    from mmoa.data.search_agent_sft import SearchSFTConfig

    config = config_from_args(SearchSFTConfig, args, SEARCH_SFT_OPTIONS)
    assert (config.segment, config.require_support, config.top_k) == (False, True, 2)


def test_generated_options_keep_unset_as_none_and_negate_booleans() -> None:
    @dataclasses.dataclass
    class Config:
        size: int = 3
        label: str | None = None
        mode: str = "a"
        keep: bool = True
        loud: bool = False

    options = {"size": Option("how many"), "label": Option("a name"),
               "mode": Option("which", choices=("a", "b"), default=FIELD_DEFAULT),
               "keep": Option("drop it", flag="--drop", negate=True), "loud": Option("louder")}
    parser = argparse.ArgumentParser()
    add_config_options(parser, Config, options)
    args = parser.parse_args([])
    assert (args.size, args.label, args.mode, args.drop, args.loud) == (None, None, "a", False,
                                                                        None)
    assert config_from_args(Config, args, options) == Config()
    args = parser.parse_args(["--size", "5", "--drop", "--loud", "--mode", "b"])
    assert config_from_args(Config, args, options) == Config(size=5, mode="b", keep=False,
                                                             loud=True)
    assert "how many (default 3)" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])


def test_a_field_without_an_option_still_gets_one() -> None:
    """At run time a config field the command does not know yet is still an option (the
    command keeps working); the test above is what reports the gap."""

    @dataclasses.dataclass
    class Config:
        size: int = 3
        new: float = 0.5

    parser = argparse.ArgumentParser()
    add_config_options(parser, Config, {"size": Option("how many")})
    assert parser.parse_args(["--new", "0.25"]).new == 0.25


def test_the_library_never_imports_the_demo_package() -> None:
    offenders = []
    for path in LIBRARY.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                          if n.split(".")[0] == "mmoa_demo"]
    assert offenders == []


def test_the_demo_builders_are_a_plugin_of_the_data_group(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """Installed, the distribution's entry point adds them to ``mmoa-cli data``; the same
    builders run as ``python -m mmoa_demo`` without it."""
    from mmoa.cli.plugins import plugin_entry_points

    assert [p.value for p in plugin_entry_points("data")] == ["mmoa_demo.cli:register"]
    kinds = next(a for a in _sub("data")._actions if isinstance(a, argparse._SubParsersAction))
    assert {"demo-world", "pretrain", "known-split", "sft", "mappo"} <= set(kinds.choices)
    assert "mmoa-cli data demo-world --out data/demo" in _sub("data").epilog
    assert main(["data", "demo-world", "--out", str(tmp_path / "w"), "--n-passages", "-1"]) == 2
    assert "nothing was written" in capsys.readouterr().err
    result = subprocess.run([sys.executable, "-m", "mmoa_demo", "demo-world", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and "--n-passages" in result.stdout
