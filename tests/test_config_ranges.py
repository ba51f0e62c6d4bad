"""Numeric config values out of range are refused when the config is parsed, in one line that
names the key (#72 item 2): a probe found ``max_grad_norm: .nan`` training an all-NaN model to
exit 0, temperatures of 1e-320, 1e+400 or a 400-digit integer and a 400-digit
``retriever_alpha`` ending in tracebacks, and learning rates, top-p and clip ranges of 1e-320
and ``max_grad_norm: -1`` accepted. One set of validators (``mmoa.config_values``) serves the
``mappo`` keys, the LLaMA-Factory keys of a ``mappo`` config, the ``retriever_rl`` keys and
``mmoa-cli eval``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from mmoa import defaults
from mmoa.config_values import (
    check_clip_range,
    check_learning_rate,
    check_max_grad_norm,
    check_temperature,
    check_top_p,
)
from mmoa.train.mappo.args import split_mappo_args, typed_llamafactory_keys
from mmoa.train.retriever_rl.args import parse_retriever_rl_args

HUGE = int("9" * 400)  # YAML reads it as a Python int no float can hold


def _one_line_naming(err: pytest.ExceptionInfo[ValueError], key: str) -> None:
    text = str(err.value)
    assert "\n" not in text and key in text and len(text) < 400, text


@pytest.mark.parametrize("value", [1e-320, 0.0, -1.0, math.inf, math.nan, HUGE, 1e3])
def test_a_temperature_out_of_range_is_refused(value: Any) -> None:
    with pytest.raises(ValueError) as err:
        check_temperature("t", value)
    _one_line_naming(err, "t ")


@pytest.mark.parametrize("check", [check_temperature, check_top_p, check_learning_rate,
                                   check_clip_range, check_max_grad_norm])
def test_each_validator_refuses_subnormals_nan_inf_and_huge_integers(check: Any) -> None:
    for value in (1e-320, math.nan, math.inf, HUGE, True, None, "abc"):
        with pytest.raises(ValueError, match=r"^key must be"):
            check("key", value)


def test_sane_values_pass_and_the_bounds_are_the_defaults() -> None:
    assert check_temperature("t", defaults.ROLLOUT_TEMPERATURE) == defaults.ROLLOUT_TEMPERATURE
    assert check_temperature("t", defaults.MIN_TEMPERATURE) == defaults.MIN_TEMPERATURE
    assert check_temperature("t", 2) == 2.0  # a YAML integer
    assert check_top_p("p", 1) == 1.0 and check_top_p("p", "0.9") == 0.9
    assert check_learning_rate("lr", 1e-6) == 1e-6
    assert check_max_grad_norm("n", 1e9) == 1e9
    # GSPO's paper clip ranges stay accepted (docs/mappo.md, Algorithms)
    assert check_clip_range("c", defaults.GSPO_CLIPRANGE, lower=True) == 3e-4
    assert check_clip_range("c", defaults.GSPO_CLIPRANGE_HIGH) == 4e-4
    with pytest.raises(ValueError, match=r"in \[1e-06, 1\)"):
        check_clip_range("c", 1.0, lower=True)


@pytest.mark.parametrize(("key", "value"), [
    ("mappo_temperature", 1e-320), ("mappo_temperature", math.inf),
    ("mappo_temperature", HUGE), ("mappo_temperature", 0),
    ("mappo_top_p", 1e-320), ("mappo_top_p", 1.5), ("mappo_top_p", math.nan),
    ("mappo_cliprange", 1e-320), ("mappo_cliprange", 1.0), ("mappo_cliprange", math.nan),
    ("mappo_cliprange_high", 1e-320), ("mappo_cliprange_high", 100.0),
    ("mappo_cliprange_value", math.nan), ("mappo_cliprange_value", 1e-320),
    ("mappo_agent_temperature", "selector=1e-320"),
    ("mappo_agent_temperature", "qr=1e400"),
    ("mappo_max_nonfinite_steps", 0),
])
def test_mappo_keys_out_of_range_are_one_line_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ValueError) as err:
        split_mappo_args({key: value})
    _one_line_naming(err, key)


def test_gspo_with_its_paper_clip_ranges_is_accepted() -> None:
    args, _ = split_mappo_args({"mappo_algorithm": "gspo", "mappo_cliprange": 3e-4,
                                "mappo_cliprange_high": 4e-4})
    assert (args.mappo_cliprange, args.mappo_cliprange_high) == (3e-4, 4e-4)
    args, _ = split_mappo_args({"mappo_temperature": 1, "mappo_top_p": 1})
    assert (args.mappo_temperature, args.mappo_top_p) == (1.0, 1.0)
    assert args.mappo_max_nonfinite_steps == defaults.MAX_NONFINITE_STEPS


@pytest.mark.parametrize(("key", "value"), [
    ("learning_rate", 1e-320), ("learning_rate", 0), ("learning_rate", math.nan),
    ("learning_rate", HUGE), ("learning_rate", "abc"),
    ("max_grad_norm", math.nan), ("max_grad_norm", -1), ("max_grad_norm", 0),
    ("max_grad_norm", math.inf), ("max_grad_norm", None),
])
def test_llamafactory_optimiser_keys_out_of_range_are_refused(key: str, value: Any) -> None:
    with pytest.raises(ValueError) as err:
        typed_llamafactory_keys({key: value})
    _one_line_naming(err, key)


def test_llamafactory_optimiser_keys_in_range_pass() -> None:
    assert typed_llamafactory_keys({"learning_rate": "1e-5", "max_grad_norm": 1}) == {
        "learning_rate": 1e-5, "max_grad_norm": 1.0}
    assert typed_llamafactory_keys({}) == {}  # Hugging Face's defaults (5e-5, 1.0) apply


def test_the_probes_nan_max_grad_norm_fails_the_command_before_anything_loads(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``max_grad_norm: .nan`` in a YAML file through ``mmoa-cli train``: exit 1, one line on
    stderr naming the key, nothing written (before: an all-NaN model, exit 0). No server is
    needed: the keys are refused before it is asked."""
    from mmoa.train.launcher import run_train

    out = tmp_path / "out"
    path = tmp_path / "run.yaml"
    path.write_text(f"stage: mappo\nmodel_name_or_path: {tiny_model_dir}\n"
                    f"finetuning_type: full\ntemplate: llama3\ndataset: tiny_mappo\n"
                    f"dataset_dir: {tiny_mappo_data_dir}\noutput_dir: {out}\n"
                    "mappo_retriever_url: http://127.0.0.1:9\nmax_grad_norm: .nan\n",
                    encoding="utf-8")
    assert run_train([str(path)]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "[mappo] error: max_grad_norm must be a finite number >= 1e-06"), lines
    assert lines[0].endswith("got nan")
    assert not list(out.glob("checkpoint-*")) and not (out / "model.safetensors").exists()


RL_BASE: dict[str, Any] = {"model_name_or_path": "m", "template": "llama3", "dataset": "d",
                           "output_dir": "o", "retriever_index": "i"}


@pytest.mark.parametrize(("key", "value"), [
    ("retriever_alpha", HUGE), ("retriever_alpha", 1e-320), ("retriever_alpha", math.nan),
    ("learning_rate", 1e-320), ("learning_rate", HUGE), ("max_grad_norm", math.nan),
    ("max_grad_norm", -1), ("retriever_cliprange", 1e-320), ("retriever_cliprange", 1.5),
    ("retriever_timeout", math.inf), ("retriever_lora_dropout", math.nan),
    ("retriever_max_nonfinite_steps", 0),
])
def test_retriever_rl_keys_out_of_range_are_one_line_naming_the_key(key: str,
                                                                   value: Any) -> None:
    with pytest.raises(ValueError) as err:
        parse_retriever_rl_args({**RL_BASE, key: value})
    _one_line_naming(err, key)


def test_retriever_rl_in_range_values_pass() -> None:
    args = parse_retriever_rl_args({**RL_BASE, "retriever_alpha": 1, "learning_rate": 1e-5})
    assert (args.retriever_alpha, args.learning_rate) == (1.0, 1e-5)
    assert args.retriever_max_nonfinite_steps == defaults.MAX_NONFINITE_STEPS


@pytest.mark.parametrize(("option", "value"), [("--temperature", "1e-320"),
                                               ("--temperature", "1e400"),
                                               ("--temperature", "nan"),
                                               ("--top_p", "1e-320")])
def test_eval_sampling_values_out_of_range_are_refused(
        option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``mmoa-cli eval --do_sample --temperature 1e-320`` was a traceback at the first sampled
    token: refused with exit 2 and one line before anything loads."""
    from mmoa.cli import main

    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "1", "question": "q?", "answers": ["a"]}\n', encoding="utf-8")
    code = main(["eval", "--model_name_or_path", str(tmp_path / "none"), "--output_dir",
                 str(tmp_path / "out"), "--data_file", str(data), "--do_sample", option, value])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and option.lstrip("-") + " must be a finite number" in lines[0], err
    assert not (tmp_path / "out").exists()
