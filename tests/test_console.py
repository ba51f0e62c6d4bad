"""Console output of the entry points: library INFO lines to library.log, ours on the console,
and result tables with readable row names."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from mmoa.cli import compare_entry

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import logging, sys
from mmoa.console import routed_library_logs
from llamafactory.extras import logging as lf_logging
import transformers.utils.logging as hf_logging
with routed_library_logs(sys.argv[1]) as path:
    print("routed", path, flush=True)
    hf_logging.set_verbosity_info()   # as LLaMA-Factory's parser does
    hf_logging.get_logger("transformers.configuration_utils").info("Model config LlamaConfig {")
    lf_logging.get_logger("llamafactory.model.loader").info("all params: 134,515,008")
    lf_logging.get_logger("llamafactory.model.loader").warning("a library warning")
    lf_logging.get_logger("llamafactory.mmoa.mappo").info("step 1: reward 0.5")
    lf_logging.get_logger("llamafactory.mmoa.mappo").warning("an own warning")
# after the block: nothing routed any more (the folder may be gone), one console line each
lf_logging.get_logger("llamafactory.model.loader").info("after: library info")
lf_logging.get_logger("llamafactory.mmoa.mappo").info("after: own info")
"""


def _probe(tmp_path: Path, **env: str) -> tuple[str, Path]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MMOA_VERBOSE", "LLAMABOARD_ENABLED", "RANK")}
    result = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "run")], cwd=ROOT,
                            env={**environ, **env}, capture_output=True, text=True, timeout=120,
                            check=True)
    return result.stdout + result.stderr, tmp_path / "run" / "library.log"


def test_library_info_goes_to_the_log_file_and_ours_stays_on_the_console(tmp_path: Path) -> None:
    console, log = _probe(tmp_path)
    assert "Model config" not in console and "all params" not in console
    assert console.count("a library warning") == 1
    assert console.count("step 1: reward 0.5") == 1
    assert console.count("an own warning") == 1  # once: by the parent's handler only
    text = log.read_text()
    for line in ("Model config", "all params", "a library warning", "step 1: reward 0.5"):
        assert line in text, line
    assert "after:" not in text
    assert console.count("after: library info") == 1 and console.count("after: own info") == 1


def test_routing_ends_with_its_block(tmp_path: Path) -> None:
    """A process that runs commands one after another (the tests, a notebook): the second
    block writes its own file and nothing is written to the first's folder once it is gone."""
    import shutil

    from mmoa.console import _library_loggers, routed_library_logs

    _library_loggers()  # the libraries attach their console handlers when first asked
    logger = logging.getLogger("llamafactory.model.loader")
    before = {name: list(logging.getLogger(name).handlers)
              for name in ("llamafactory", "transformers", "llamafactory.mmoa")}
    with routed_library_logs(tmp_path / "first") as first:
        assert first == tmp_path / "first" / "library.log"
        with routed_library_logs(tmp_path / "nested") as nested:
            assert nested is None  # one routing at a time
        logger.warning("first run")
    shutil.rmtree(tmp_path / "first")
    with routed_library_logs(tmp_path / "second"):
        logger.warning("second run")
    logger.warning("after both")  # must not try to reopen first/library.log
    assert not (tmp_path / "first").exists()
    assert (tmp_path / "second" / "library.log").read_text().count("run") == 1
    assert {name: list(logging.getLogger(name).handlers) for name in before} == before


def test_verbose_and_web_ui_runs_are_left_alone(tmp_path: Path) -> None:
    for env in ({"MMOA_VERBOSE": "1"}, {"LLAMABOARD_ENABLED": "1"}):
        console, log = _probe(tmp_path, **env)
        assert "routed None" in console
        assert "Model config" in console and "all params" in console
        assert console.count("step 1: reward 0.5") == 1
        assert not log.exists()


def test_other_ranks_write_their_own_log(tmp_path: Path) -> None:
    _, log = _probe(tmp_path, RANK="1")
    assert not log.exists()
    assert "Model config" in (log.parent / "library.rank1.log").read_text()


def test_faiss_loader_probing_is_not_logged_at_info() -> None:
    from mmoa.console import quiet_faiss_loader

    quiet_faiss_loader()
    assert not logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
    assert logging.getLogger("faiss.loader").isEnabledFor(logging.WARNING)


def test_compare_entries_name_their_rows(tmp_path: Path) -> None:
    assert compare_entry("warm start (SFT)=outputs/demo/eval_sft") == (
        "warm start (SFT)", "outputs/demo/eval_sft")
    assert compare_entry("outputs/demo/eval_sft") == ("outputs/demo/eval_sft",) * 2
    odd = tmp_path / "lr=1e-5"  # an existing path with '=' is a path, not NAME=PATH
    odd.mkdir()
    assert compare_entry(str(odd)) == (str(odd), str(odd))
    assert compare_entry("=x") == ("=x", "=x")


def test_mappo_step_summary_names_reward_f1_kl_and_penalties() -> None:
    from mmoa.train.mappo.log import step_summary

    logs = {"reward": 0.0, "answer_f1": 0.41666, "kl": 0.1234, "loss": -0.01234,
            "approx_kl": 0.00051, "penalty_rate/qr": 0.0, "penalty_rate/generator": 0.125,
            "time/step": 320.04}
    assert step_summary(3, 20, logs) == (
        "[mappo] step 3/20: reward 0.000, answer F1 0.417, KL 0.123, loss -0.0123, "
        "approx_kl 0.0005, penalty rate qr 0.00 / generator 0.12, 320.0 s")
    assert step_summary(1, 2, {}) == (
        "[mappo] step 1/2: reward -, answer F1 -, KL -, loss -, approx_kl -")
    grpo = {"reward": 0.5, "grpo/zero_variance_groups": 3.0, "grpo/groups": 4.0}
    assert step_summary(1, 2, grpo).endswith(", approx_kl -, zero-variance groups 3/4")
