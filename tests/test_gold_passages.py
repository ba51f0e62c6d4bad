"""The gold-passage oracle ``gold_g``: :class:`mmoa.retrieval.gold.GoldPassages` and one
evaluation of the tiny model on the gold passages, without a retrieval server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.data.records import QARecord
from mmoa.retrieval.gold import GoldPassages


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return _write_jsonl(tmp_path / "corpus.jsonl", [
        {"id": "p1", "title": "Ada", "text": "Ada was born in Brill."},
        {"id": "p2", "title": "Brill", "text": "Brill is in Lorketh."},
        {"id": "p3", "title": "Cato", "text": "Cato wrote a book."},
    ])


@pytest.fixture
def flashrag_corpus(tmp_path: Path) -> Path:
    """FlashRAG's layout: quoted titles in ``contents``; ``Evan Morris`` in three chunks."""
    return _write_jsonl(tmp_path / "wiki.jsonl", [
        {"id": "1", "contents": '"Evan Morris"\nEvan L. Morris was a lobbyist.'},
        {"id": "2", "contents": '"Ed Wood"\nEdward Davis Wood Jr. was a filmmaker.'},
        {"id": "3", "contents": '"Evan Morris"\nHe worked for Genentech.'},
        {"id": "4", "contents": '"Evan Morris"\nHe died in 2015.'},
        {"id": "5", "contents": '"Scott Derrickson"\nScott Derrickson is a director.'},
    ])


def test_ids_are_looked_up_in_the_records_order(corpus: Path) -> None:
    records = [QARecord("q1", "Where was Ada born?", ["Lorketh"], supporting_ids=["p2", "p1"]),
               QARecord("q2", "What did Cato write?", ["a book"], supporting_ids=["p3"])]
    gold = GoldPassages.from_records(records, corpus)
    docs = gold.search_documents(["Where was Ada born?", "What did Cato write?"], 10)
    assert docs == [[{"id": "p2", "contents": "Brill\nBrill is in Lorketh."},
                     {"id": "p1", "contents": "Ada\nAda was born in Brill."}],
                    [{"id": "p3", "contents": "Cato\nCato wrote a book."}]]
    assert gold.search_documents(["Where was Ada born?"], 1) == [docs[0][:1]]


def test_titles_match_as_gold_support_normalises_them(flashrag_corpus: Path) -> None:
    """HotpotQA titles (``_`` for a space, other case) against FlashRAG's quoted titles: every
    chunk of a gold article, one of each article in turn, at most k."""
    record = QARecord("h1", "Were Evan Morris and Ed Wood both American?", ["yes"],
                      supporting_titles=["evan_morris", "Ed  Wood"])
    gold = GoldPassages.from_records([record], flashrag_corpus)
    [docs] = gold.search_documents([record.question], 10)
    assert [d["id"] for d in docs] == ["1", "2", "3", "4"]
    assert docs[1]["contents"] == '"Ed Wood"\nEdward Davis Wood Jr. was a filmmaker.'
    assert [d["id"] for d in gold.search_documents([record.question], 3)[0]] == ["1", "2", "3"]
    capped = GoldPassages.from_records([record], flashrag_corpus, per_title=2)
    assert [d["id"] for d in capped.search_documents([record.question], 10)[0]] == \
        ["1", "2", "3"]


def test_an_index_folder_is_read_through_its_stored_passages(tmp_path: Path,
                                                             corpus: Path) -> None:
    from mmoa.retrieval.corpus import iter_corpus, write_corpus_store

    index = tmp_path / "index"
    write_corpus_store(iter_corpus(corpus), index / "corpus", progress=False)
    record = QARecord("q1", "Where was Ada born?", ["Lorketh"], supporting_ids=["p1"])
    for source in (index, index / "corpus"):
        docs = GoldPassages.from_records([record], source).search_documents([record.question], 5)
        assert docs == [[{"id": "p1", "contents": "Ada\nAda was born in Brill."}]]


def test_a_record_without_gold_passages_is_named(corpus: Path) -> None:
    records = [QARecord("q1", "Where was Ada born?", ["Lorketh"], supporting_ids=["p1"]),
               QARecord("q2", "Who is Cato?", ["a writer"]),
               QARecord("q3", "Who is Dan?", ["a cook"], supporting_titles=[])]
    with pytest.raises(ValueError, match=r"2 of 3 record\(s\) name no gold supporting passage"
                                         r".*'q2', 'q3'.*--max_samples"):
        GoldPassages.from_records(records, corpus)


def test_a_gold_passage_missing_from_the_corpus_is_named(corpus: Path) -> None:
    records = [QARecord("q1", "Where was Ada born?", ["Lorketh"], supporting_ids=["p1", "p9"]),
               QARecord("q2", "Who was Zed?", ["x"], supporting_titles=["Zed"])]
    with pytest.raises(ValueError) as err:
        GoldPassages.from_records(records, corpus)
    message = str(err.value)
    assert "2 gold passage(s) are not in the corpus" in message and str(corpus) in message
    assert "id 'p9' (record 'q1')" in message and "title 'zed' (record 'q2')" in message


def test_one_question_with_two_different_gold_sets_is_refused(corpus: Path) -> None:
    same = [QARecord("q1", "Where was Ada born?", ["Lorketh"], supporting_ids=["p1", "p2"]),
            QARecord("q1b", "Where was Ada born?", ["Lorketh"], supporting_ids=["p2", "p1"])]
    assert GoldPassages.from_records(same, corpus).search_documents([same[0].question], 5)
    other = [same[0], QARecord("q2", "Where was Ada born?", ["Brill"], supporting_ids=["p1"])]
    with pytest.raises(ValueError, match="records 'q1' and 'q2' ask the same question"):
        GoldPassages.from_records(other, corpus)


def test_an_unknown_question_or_source_is_an_error(tmp_path: Path, corpus: Path) -> None:
    record = QARecord("q1", "Where was Ada born?", ["Lorketh"], supporting_ids=["p1"])
    with pytest.raises(ValueError, match="not the question of any record"):
        GoldPassages.from_records([record], corpus).search_documents(["Who is Cato?"], 5)
    with pytest.raises(FileNotFoundError, match="gold corpus not found"):
        GoldPassages.from_records([record], tmp_path / "nothing.jsonl")
    with pytest.raises(FileNotFoundError, match=r"passages\.arrow"):
        GoldPassages.from_records([record], tmp_path)


def test_the_config_requires_gold_corpus_for_gold_g_only(tmp_path: Path, corpus: Path) -> None:
    from mmoa.evaluation import EVAL_MODES, EvalConfig

    assert "gold_g" in EVAL_MODES
    base = {"model_name_or_path": "m", "template": "llama3", "output_dir": str(tmp_path / "o"),
            "data_file": str(corpus)}
    EvalConfig(**base, mode="gold_g", gold_corpus=str(corpus)).validate()
    assert not EvalConfig(**base, mode="gold_g", gold_corpus=str(corpus)).needs_retriever
    with pytest.raises(ValueError, match="mode gold_g needs --gold_corpus"):
        EvalConfig(**base, mode="gold_g").validate()
    with pytest.raises(ValueError, match=r"gold_corpus .*not found"):
        EvalConfig(**base, mode="gold_g", gold_corpus=str(tmp_path / "none.jsonl")).validate()
    with pytest.raises(ValueError, match="gold_corpus is read only by mode gold_g"):
        EvalConfig(**base, mode="rag", gold_corpus=str(corpus)).validate()


def test_the_playground_does_not_offer_the_oracle() -> None:
    from mmoa.agents.modes import MODE_AGENTS, MODES, ORACLE_MODES
    from mmoa.webui.playground import modes_legend

    assert set(ORACLE_MODES).isdisjoint(MODES)
    assert MODE_AGENTS["gold_g"] == ("generator",)
    assert "gold_g" not in modes_legend()


def test_gold_g_evaluates_the_generator_on_the_gold_passages(
        tiny_model_dir: Path, tiny_world_dir: Path, tmp_path: Path) -> None:
    """No retrieval server: each row's candidates are the record's supporting passages."""
    from mmoa.data.loaders import load_qa
    from mmoa.evaluation import EvalConfig, evaluate, format_table

    config = EvalConfig(
        model_name_or_path=str(tiny_model_dir), template="llama3",
        output_dir=str(tmp_path / "gold"), data_file=str(tiny_world_dir / "dev.jsonl"),
        data_format="demo", retriever_url="http://127.0.0.1:9", mode="gold_g",
        gold_corpus=str(tiny_world_dir / "corpus.jsonl"), batch_size=8, max_samples=8,
        max_new_tokens_generator=12)
    metrics = evaluate(config, progress=False)
    records = {r.id: r for r in load_qa(tiny_world_dir / "dev.jsonl", "demo", max_samples=8)}
    rows = [json.loads(line)
            for line in (tmp_path / "gold" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and metrics["mode"] == "gold_g"
    for row in rows:
        assert [c["id"] for c in row["candidates"]] == records[row["id"]].supporting_ids
        assert row["selected_ids"] == list(range(len(row["candidates"])))
        assert set(row["raw_outputs"]) == {"generator"}
        assert row["agent_stats"]["retrieval"]["support_recall"] == 1.0
    assert metrics["agents"]["retrieval"]["candidate_support_recall"] == 1.0
    assert "qr" not in metrics["agents"] and "selector" not in metrics["agents"]
    assert metrics["config"]["gold_corpus"] == config.gold_corpus
    assert "gold_g" in format_table([("gold", metrics)])


def test_the_command_line_takes_gold_corpus_and_refuses_it_without_gold_g(
        tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.cli import main as cli_main

    def run(*extra: str) -> int:
        return cli_main(["eval", "--model_name_or_path", str(tmp_path / "model"),
                         "--data_file", str(corpus), "--output_dir", str(tmp_path / "o"),
                         *extra])

    assert run("--mode", "gold_g") == 2
    assert "mode gold_g needs --gold_corpus" in capsys.readouterr().err
    assert run("--mode", "rag", "--gold_corpus", str(corpus)) == 2
    assert "gold_corpus is read only by mode gold_g" in capsys.readouterr().err
