"""The RAG Playground tab: one question through QR -> Retriever -> Selector -> Generator.

A researcher looking at a checkpoint wants to see *why* an answer came out: which sub-questions
the Query Rewriter wrote, which documents the retriever returned for each (with their corpus
ids), which of them the Selector kept, what the Generator answered, and how long each agent
took. The tab runs the same :class:`~mmoa.agents.pipeline.RagPipeline` as evaluation and MAPPO
rollouts (greedy decoding, the same prompts), so what it shows is what the metrics measure.

Whatever the model writes is shown as it is: an untrained model's sub-questions may be empty (the
pipeline then searches with the question itself) and its selection may be empty.

A user cannot judge an answer without the gold one: a question picked from a loaded QA file
(e.g. ``data/demo/test.jsonl``) is shown with its gold answers, EM / F1 of the prediction
(:func:`mmoa.metrics.score_answer`, the evaluation's scoring) and its gold passages, marked where
the retriever found them and whether the Selector kept them. Before a question goes to the
retrieval server, its health is asked (:mod:`mmoa.webui.server_check`): a server that is down is
one actionable line instead of the client's retries, a question longer than the server accepts
is refused with what to do before the model runs, and the demo world's fictional corpus is named.
"""

from __future__ import annotations

import html
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmoa.agents.modes import MODE_AGENTS
from mmoa.agents.pipeline import MODES, Trace
from mmoa.webui.server_check import DEFAULT_MAX_QUERY_CHARS, ServerReport

if TYPE_CHECKING:
    from gradio.components import Component

#: The models ``run_demo.sh`` leaves (relative to the folder the UI runs in), most trained
#: first, with their chat templates: the tab starts on the first one that exists.
DEMO_MODELS: tuple[tuple[str, str], ...] = (
    ("saves/smollm2-135m/full/mappo", "smollm2"),
    ("saves/smollm2-135m/full/sft", "smollm2"),
    ("models/smollm2-135m-instruct", "smollm2"),
    ("saves/tiny-llama3/full/mappo", "llama3"),
    ("saves/tiny-llama3/full/sft", "llama3"),
    ("models/tiny-llama3", "llama3"),
)
DEFAULT_TEMPLATE = "smollm2"
DEFAULT_RETRIEVER = "http://127.0.0.1:8000"
SNIPPET_CHARS = 220
#: QA files the tab offers first (relative to the folder the UI runs in), the first present.
DEFAULT_QA_FILES = ("data/demo/test.jsonl", "data/demo/dev.jsonl")
#: Questions of a QA file listed for picking (a long test set would make a huge dropdown).
MAX_LISTED_QUESTIONS = 500
#: Agent names as the page shows them.
AGENT_TITLES = {"qr": "Query Rewriter", "selector": "Selector", "generator": "Generator"}

#: Inline styles, so the highlight survives any gradio theme and shows in screenshots.
_SELECTED_STYLE = "background:#fff3bf;font-weight:600"
_TABLE_STYLE = "width:100%;border-collapse:collapse;font-size:0.9em"
_CELL_STYLE = "border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top"


@dataclass(frozen=True)
class ModelKey:
    """What identifies a loaded model: the same key is not loaded twice."""

    model_path: str
    adapter_path: str
    template: str


@dataclass
class PlaygroundAnswer:
    """One question's trace and the seconds each stage took."""

    trace: Trace
    timings: dict[str, float]
    total_seconds: float
    mode: str


@dataclass
class PlaygroundSession:
    """The model the playground holds (one at a time) and the lock that serialises requests.

    Generation on one model is not re-entrant, and a second copy of a large model would not fit,
    so requests run one after the other.
    """

    key: ModelKey | None = None
    model: Any = None
    tokenizer: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self, model_path: str, adapter_path: str, template: str) -> str:
        """Load (or keep) the model; returns a status line."""
        from mmoa.modeling import load_for_inference

        key = ModelKey(model_path.strip(), adapter_path.strip(), template.strip())
        if not key.model_path:
            raise ValueError("give the path of a local model directory")
        if not key.template:
            raise ValueError("choose the chat template of the model (e.g. llama3)")
        with self.lock:
            if key != self.key:
                self.model = self.tokenizer = self.key = None  # free the old one first
                start = time.perf_counter()
                try:
                    self.model, self.tokenizer = load_for_inference(
                        key.model_path, key.template, key.adapter_path or None)
                except FileNotFoundError:
                    raise  # our own check's message already names the missing file
                except (OSError, ValueError) as err:  # transformers' tokenizer errors, often
                    # several lines long and without the folder
                    first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                    raise ValueError(f"cannot load a model from {_describe(key)}: "
                                     f"{first}; "
                                     "is it a model folder (config.json, weights, "
                                     "tokenizer)?") from err
                self.key = key
                seconds = time.perf_counter() - start
                return f"loaded {_describe(key)} in {seconds:.1f} s"
        # The session is the UI's, shared by every page open on it.
        return f"using {_describe(key)} (loaded earlier in this web UI)"

    def ask(self, question: str, retriever_url: str, top_k: Any, mode: str,
            max_query_chars: int = DEFAULT_MAX_QUERY_CHARS) -> PlaygroundAnswer:
        from mmoa.agents.pipeline import RagPipeline
        from mmoa.retrieval.client import RetrievalClient

        question = question.strip()
        if not question:
            raise ValueError("type a question")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        check_question_length(question, mode, max_query_chars)
        top_k = top_k_count(top_k)
        with self.lock:
            if self.key is None:
                raise ValueError("load a model first")
            check_question_fits_model(question, self.tokenizer, self.model, self.key.template,
                                      mode)
            retriever = None
            if mode != "g":
                retriever = RetrievalClient(retriever_url.strip(), timeout=30.0, retries=1)
            try:
                pipeline = RagPipeline(self.model, self.tokenizer, self.key.template, retriever,
                                       mode=mode, k=top_k)  # type: ignore[arg-type]
                start = time.perf_counter()
                trace = pipeline.run([question])[0]
                total = time.perf_counter() - start
            finally:
                if retriever is not None:
                    retriever.close()
            return PlaygroundAnswer(trace, pipeline.last_timings.as_dict(), total, mode)


def check_question_fits_model(question: str, tokenizer: Any, model: Any, template: str,
                              mode: str) -> None:
    """Refuse, before generating, a question whose prompt for some agent of ``mode`` plus the
    tokens that agent may write is longer than the model's context (``max_position_embeddings``
    or the tokenizer's ``model_max_length``; :mod:`mmoa.agents.context_limit`, as ``mmoa-cli
    eval`` does). In mode ``g`` no server limit applies: a 200,000-character question held the
    Playground's one model for minutes, and a shorter one that fills the context leaves the
    Generator no room for its answer (it wrote on past the positions it was trained on)."""
    if tokenizer is None:
        return
    from mmoa.agents.context_limit import check_questions_fit, model_context, question_prompts
    from mmoa.agents.render import PromptRenderer
    from mmoa.defaults import MAX_NEW_TOKENS

    check_questions_fit(PromptRenderer(tokenizer, template), model_context(model, tokenizer),
                        [question], question_prompts(mode, MAX_NEW_TOKENS))


def retrieves(mode: str) -> bool:
    """Whether ``mode`` calls the retrieval server (every mode but ``g``, as
    :class:`~mmoa.agents.pipeline.RagPipeline` runs them)."""
    return mode != "g"


def describe_mode(mode: str) -> str:
    """One line per mode code, derived from the modes' agent table
    (:data:`mmoa.agents.modes.MODE_AGENTS`), so it cannot drift from what runs."""
    agents = MODE_AGENTS[mode]
    chain = [AGENT_TITLES["qr"]] if "qr" in agents else []
    chain += ["Retriever"] if retrieves(mode) else []
    chain += [AGENT_TITLES[a] for a in ("selector", "generator") if a in agents]
    query = ("the Query Rewriter's sub-questions are searched" if "qr" in agents
             else "the question itself is searched" if retrieves(mode)
             else "closed book: no retrieval")
    return f"{' → '.join(chain)} ({query})"


def modes_legend() -> str:
    """The Mode dropdown's legend (Markdown): one line per mode code."""
    return "\n".join(f"- `{mode}`: {describe_mode(mode)}" for mode in MODES)


def check_question_length(question: str, mode: str, limit: int = DEFAULT_MAX_QUERY_CHARS
                          ) -> None:
    """Refuse, before the model runs, a question the retrieval server would refuse (it searches
    with the question itself when the Query Rewriter writes nothing usable)."""
    if retrieves(mode) and len(question) > limit:
        raise ValueError(
            f"the question has {len(question):,} characters; the retrieval server accepts at "
            f"most {limit:,} per query. Shorten it to the question itself (no pasted "
            f"documents), or choose mode g (no retrieval)")


def default_qa_file(root: Path = Path(".")) -> str:
    """The QA file the tab offers: the demo world's test set when it is there."""
    return next((f for f in DEFAULT_QA_FILES if (root / f).is_file()), "")


def load_questions(path: str) -> list[dict[str, Any]]:
    """The records of a QA file (any format ``mmoa-cli eval`` reads), as dicts for the page's
    state; raises ``ValueError`` / ``OSError`` naming the file."""
    from mmoa.data.loaders import load_qa

    path = (path or "").strip()
    if not path:
        raise ValueError("give the path of a QA file (e.g. data/demo/test.jsonl)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return [r.to_dict() for r in load_qa(path, max_samples=MAX_LISTED_QUESTIONS)]


def question_choices(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(label, record id)`` for the question dropdown."""
    return [(f"{r['id']}: {r['question']}", str(r["id"])) for r in records]


def find_record(records: list[dict[str, Any]] | None, question: str
                ) -> dict[str, Any] | None:
    """The loaded record whose question is ``question`` (as asked: edited text has no gold)."""
    question = question.strip()
    return next((r for r in records or () if r["question"].strip() == question), None)


def render_gold(answer: PlaygroundAnswer, record: dict[str, Any] | None,
                profile: str | None = None) -> str:
    """The gold answers with EM / F1 of the prediction and the gold passages, marked where the
    retriever found them and whether the Selector kept them; a note when no gold is known."""
    from mmoa.data.records import QARecord
    from mmoa.data.support import GoldSupport
    from mmoa.metrics import DEFAULT_PROFILE, score_answer

    if record is None:
        return ('<div id="mmoa-gold"><p><em>no gold answer: pick a question from a loaded QA '
                "file to see its gold answer and passages</em></p></div>")
    profile = profile or DEFAULT_PROFILE
    rec = QARecord.from_dict(record)
    scores = score_answer(answer.trace.answer, rec.answers, profile=profile)
    golds = " | ".join(html.escape(a) for a in rec.answers)
    parts = [f'<div id="mmoa-gold"><p><b>Gold answer:</b> <span class="mmoa-gold-answer">'
             f"{golds}</span></p>",
             f'<p class="mmoa-gold-scores"><b>EM</b> {scores.em:.0f} · <b>F1</b> '
             f"{scores.f1:.2f} (scoring {html.escape(profile)})</p>"]
    support = GoldSupport.of(rec)
    if support is None:
        parts.append("<p><em>the record names no gold passage</em></p></div>")
        return "".join(parts)
    trace = answer.trace
    found: dict[str, int] = {}
    for index, candidate in enumerate(trace.candidates):
        key = support.key(candidate)
        if key in support.keys:
            found.setdefault(key, index)
    selected = set(trace.selected)
    items = []
    for key in sorted(support.keys):
        index = found.get(key)
        if index is None:
            where = "not retrieved"
        else:
            title = trace.candidates[index].text.partition("\n")[0]
            kept = "selected ✔" if index in selected else "not selected ✘"
            where = f"retrieved as Document{index} ({html.escape(title)}); {kept}"
            if answer.mode not in ("s_g", "qr_s_g"):
                where = f"retrieved as Document{index} ({html.escape(title)})"
        items.append(f'<li class="mmoa-gold-passage" data-key="{html.escape(key, quote=True)}">'
                     f"<code>{html.escape(key)}</code>: {where}</li>")
    by = "ids" if support.by == "id" else "titles"
    parts.append(f"<p><b>Gold passages</b> (by {by}; retrieved "
                 f"{len(found)}/{len(support.keys)}):</p><ul>{''.join(items)}</ul></div>")
    return "".join(parts)


def default_model(root: Path = Path(".")) -> tuple[str, str]:
    """``(model folder, template)`` the tab starts with: the most trained demo model present
    under ``root``, else an empty path and SmolLM2's template."""
    for folder, template in DEMO_MODELS:
        if (root / folder / "config.json").is_file():
            return folder, template
    return "", DEFAULT_TEMPLATE


def _describe(key: ModelKey) -> str:
    adapter = f" + adapter {key.adapter_path}" if key.adapter_path else ""
    return f"{key.model_path}{adapter} (template {key.template})"


# ------------------------------------------------------------------------------- rendering


def render_subquestions(answer: PlaygroundAnswer) -> str:
    trace = answer.trace
    if not retrieves(answer.mode):  # mode g said "the question itself is searched"
        note = "closed book: nothing is searched in this mode, the Generator answers alone"
    elif answer.mode not in ("qr_g", "qr_s_g"):
        note = "no Query Rewriter in this mode: the question itself is searched"
    elif trace.qr_parse is not None and trace.qr_parse.empty:
        note = "the Query Rewriter wrote no usable sub-question: the question itself is searched"
    else:
        note = ""
    items = "".join(f"<li>{html.escape(s)}</li>" for s in trace.subquestions)
    note_html = f'<p class="mmoa-note"><em>{html.escape(note)}</em></p>' if note else ""
    return f'<div id="mmoa-subquestions-list">{note_html}<ol>{items}</ol></div>'


def render_candidates(answer: PlaygroundAnswer, record: dict[str, Any] | None = None) -> str:
    """The candidates table; with the question's ``record``, a column marks its gold passages."""
    from mmoa.data.records import QARecord
    from mmoa.data.support import GoldSupport

    trace = answer.trace
    if not trace.candidates:
        return '<div id="mmoa-candidates-table"><p><em>no retrieval in this mode</em></p></div>'
    support = GoldSupport.of(QARecord.from_dict(record)) if record is not None else None
    selected = set(trace.selected)
    columns = ("#", "doc id", "title", "sub-question", "rank", "selected")
    head = "".join(f'<th style="{_CELL_STYLE}">{h}</th>'
                   for h in columns + (("gold",) if support is not None else ()))
    rows = []
    for index, candidate in enumerate(trace.candidates):
        title, _, text = candidate.text.partition("\n")
        snippet = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…"
        chosen = index in selected
        row_attrs = (f'class="mmoa-candidate mmoa-selected" style="{_SELECTED_STYLE}"' if chosen
                     else 'class="mmoa-candidate"')
        cells = (
            f"Document{index}",
            f'<code class="mmoa-doc-id">{html.escape(str(candidate.id or "-"))}</code>',
            f"<b>{html.escape(title)}</b><br><small>{html.escape(snippet)}</small>",
            _subquestion_cell(trace, candidate.subquestion),
            str(candidate.rank + 1),
            "✔" if chosen else "",
        )
        gold = support is not None and support.matches(candidate)
        if support is not None:
            cells += ('<span class="mmoa-gold-mark">★ gold</span>' if gold else "",)
        rows.append(f'<tr {row_attrs} data-index="{index}" data-gold="{int(gold)}">'
                    + "".join(f'<td style="{_CELL_STYLE}">{c}</td>' for c in cells) + "</tr>")
    return (f'<div id="mmoa-candidates-table"><table style="{_TABLE_STYLE}"><thead><tr>{head}'
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _subquestion_cell(trace: Trace, index: int) -> str:
    """The sub-question's number, with its text as a tooltip (the list above shows it)."""
    text = trace.subquestions[index] if 0 <= index < len(trace.subquestions) else ""
    return f'<span title="{html.escape(text, quote=True)}">{index + 1}</span>'


def render_selection(answer: PlaygroundAnswer) -> str:
    trace = answer.trace
    if answer.mode not in ("s_g", "qr_s_g"):
        return "no Selector in this mode: every candidate goes to the Generator"
    raw = trace.calls["selector"].response_text if "selector" in trace.calls else ""
    chosen = ", ".join(f"Document{i}" for i in trace.selected) or "none (no document selected)"
    flags = []
    parse = trace.selection_parse
    if parse is not None:
        flags = [name for name in ("malformed", "out_of_range", "duplicate") if getattr(parse,
                                                                                      name)]
    suffix = f" [{', '.join(flags)}]" if flags else ""
    return f"selected: {chosen}{suffix}\nSelector output: {raw!r}"


def render_timings(answer: PlaygroundAnswer) -> str:
    labels = {"qr": "Query Rewriter", "retrieve": "Retriever", "selector": "Selector",
              "generator": "Generator"}
    rows = "".join(
        f'<tr class="mmoa-timing" data-agent="{name}"><td style="{_CELL_STYLE}">{label}</td>'
        f'<td style="{_CELL_STYLE}">{answer.timings.get(name, 0.0):.3f} s</td></tr>'
        for name, label in labels.items()
    )
    total = (f'<tr><td style="{_CELL_STYLE}"><b>total</b></td><td style="{_CELL_STYLE}"><b>'
             f"{answer.total_seconds:.3f} s</b></td></tr>")
    return f'<table id="mmoa-timings-table" style="{_TABLE_STYLE}">{rows}{total}</table>'


# ---------------------------------------------------------------------------------- the tab

#: Status line prefix of a question that failed; the result fields are then empty.
ERROR_PREFIX = "error: "
def top_k_count(value: Any) -> int:
    """The Top-K field as a count of documents: a whole number >= 1. Anything else (empty,
    ``inf``, ``nan``, ``2.5``, text) is a ``ValueError`` for the status line; ``int(inf)``
    was an ``OverflowError`` traceback."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number != int(number) \
            or number < 1:
        raise ValueError(f"Top-K must be a whole number of at least 1, got {value!r}")
    return int(number)


#: answer, sub-questions, selection, timings, candidates, raw trace, gold
EMPTY_RESULTS: tuple[Any, ...] = ("", "", "", "", "", None, "")
#: Added to the status line when the server serves the generated demo world.
DEMO_NOTE = ("; the server serves the DEMO WORLD, a fictional corpus: real-world questions "
             "find no answer there")


def ask_for_page(session: PlaygroundSession, path: str, adapter: str, template: str, url: str,
                 top_k: float, mode: str, question: str,
                 records: list[dict[str, Any]] | None = None) -> tuple[Any, ...]:
    """The tab's outputs for one question: status, answer, sub-questions, selection, timings,
    candidates, raw trace and gold (when ``question`` is one of the loaded ``records``); a
    failure (no model, no server, bad input) is the status line, with every result field
    empty, so nothing of an earlier question is left on screen."""
    from mmoa.webui.server_check import check_server, refusal_line

    try:
        loaded = session.load(path, adapter or "", template or "")
        top_k_count(top_k)  # the user's own input is checked before the server is asked
        report: ServerReport | None = None
        if retrieves(mode):
            report = check_server(url)
            if not report.ok:
                raise ValueError(refusal_line(report))
        limit = report.max_query_chars if report is not None else DEFAULT_MAX_QUERY_CHARS
        result = session.ask(question, url, top_k, mode, max_query_chars=limit)
    except (ValueError, OSError, RuntimeError) as err:  # includes retriever errors
        return (f"{ERROR_PREFIX}{err}", *EMPTY_RESULTS)
    status_line = (f"{loaded}; answered in {result.total_seconds:.2f} s "
                   f"({len(result.trace.candidates)} candidates)"
                   + (DEMO_NOTE if report is not None and report.demo else ""))
    record = find_record(records, question)
    return (status_line, result.trace.answer, render_subquestions(result),
            render_selection(result), render_timings(result),
            render_candidates(result, record), result.trace.to_dict(),
            render_gold(result, record))


def _heading(text: str, name: str) -> Any:
    """A heading over a result block (gr.HTML shows no label of its own)."""
    import gradio as gr

    return gr.Markdown(f"#### {text}", elem_id=f"mmoa-pg-heading-{name}",
                       elem_classes=["mmoa-pg-heading"])


def create_playground_tab(session: PlaygroundSession | None = None) -> dict[str, Component]:
    """Build the tab's components inside the current gradio context and wire the buttons."""
    import gradio as gr
    from llamafactory.data import TEMPLATES

    session = session or PlaygroundSession()
    model_dir, model_template = default_model()
    with gr.Row():
        model_path = gr.Textbox(label="Model path", value=model_dir, scale=3,
                                info="local model directory (a base or full fine-tuned model)",
                                elem_id="mmoa-pg-model_path")
        adapter_path = gr.Textbox(label="Adapter path (optional)", scale=3,
                                  info="LoRA adapter directory, e.g. a MAPPO output_dir",
                                  elem_id="mmoa-pg-adapter_path")
        template = gr.Dropdown(label="Template", choices=sorted(TEMPLATES), scale=1,
                               value=model_template, elem_id="mmoa-pg-template")
        load_btn = gr.Button("Load model", scale=1, elem_id="mmoa-pg-load")
    with gr.Row():
        retriever_url = gr.Textbox(label="Retriever URL", value=DEFAULT_RETRIEVER, scale=3,
                                   info="the retrieval server (bash run_server.sh --index DIR)",
                                   elem_id="mmoa-pg-retriever_url")
        check_btn = gr.Button("Check server", scale=0, min_width=120,
                              elem_id="mmoa-pg-check_server")
        top_k = gr.Number(label="Top-K", value=10, precision=0, minimum=1, scale=1,
                          info="candidate documents", elem_id="mmoa-pg-top_k")
        mode = gr.Dropdown(label="Mode", choices=list(MODES), value="qr_s_g", scale=1,
                           info="the agents that run (legend below)", elem_id="mmoa-pg-mode")
    server_info = gr.HTML(elem_id="mmoa-pg-server_info")
    with gr.Accordion("Modes", open=False, elem_id="mmoa-pg-modes_tab"):
        gr.Markdown(modes_legend(), elem_id="mmoa-pg-modes")
    with gr.Row():
        qa_file = gr.Textbox(label="QA file (optional)", value=default_qa_file(), scale=3,
                             info="questions with gold answers, e.g. data/demo/test.jsonl: "
                                  "a question picked from it is shown with its gold",
                             elem_id="mmoa-pg-qa_file")
        qa_load_btn = gr.Button("Load questions", scale=0, min_width=140,
                                elem_id="mmoa-pg-qa_load")
        qa_pick = gr.Dropdown(label="Question from the file", choices=[], scale=4,
                              info="fills the question box", elem_id="mmoa-pg-qa_pick")
    records = gr.State([])
    status = gr.Textbox(label="Status", interactive=False, elem_id="mmoa-pg-status")
    with gr.Row():
        question = gr.Textbox(
            label=f"Question (at most {DEFAULT_MAX_QUERY_CHARS:,} characters in a retrieval "
                  "mode: the server's limit)", scale=5, lines=1, max_lines=4,
            elem_id="mmoa-pg-question",
            placeholder="e.g. Who founded the city where X was born?")
        ask_btn = gr.Button("Ask", variant="primary", scale=1, elem_id="mmoa-pg-ask")
    with gr.Row():
        with gr.Column(scale=2):
            answer = gr.Textbox(label="Answer (Generator)", interactive=False,
                                elem_id="mmoa-pg-answer")
            _heading("Gold (from the QA file)", "gold")
            gold = gr.HTML(elem_id="mmoa-pg-gold")
            _heading("Sub-questions (Query Rewriter)", "subquestions")
            subquestions = gr.HTML(elem_id="mmoa-pg-subquestions")
            selection = gr.Textbox(label="Selection (Selector)", interactive=False, lines=2,
                                   elem_id="mmoa-pg-selection")
        with gr.Column(scale=1):
            _heading("Time per agent", "timings")
            timings = gr.HTML(elem_id="mmoa-pg-timings")
    _heading("Candidate documents (Retriever; the Selector's choice highlighted)", "candidates")
    candidates = gr.HTML(elem_id="mmoa-pg-candidates")
    with gr.Accordion("Raw agent outputs", open=False):
        raw = gr.JSON(elem_id="mmoa-pg-raw")

    def on_load(path: str, adapter: str, tmpl: str) -> str:
        try:
            return session.load(path, adapter or "", tmpl or "")
        except (ValueError, OSError) as err:
            raise gr.Error(str(err)) from err

    def on_ask(*values: Any) -> tuple[Any, ...]:
        outputs = ask_for_page(session, *values)
        if outputs[0].startswith(ERROR_PREFIX):
            gr.Warning(outputs[0][len(ERROR_PREFIX):])
        return outputs

    def clear_results() -> tuple[Any, ...]:
        """Empty the result fields before a question, so that an error leaves no answer of
        the previous question on screen."""
        return ("asking…", *EMPTY_RESULTS)

    def on_load_questions(path: str) -> tuple[Any, Any]:
        try:
            loaded = load_questions(path)
        except (ValueError, OSError) as err:  # DataFormatError is a ValueError
            raise gr.Error(str(err)) from err
        return loaded, gr.Dropdown(choices=question_choices(loaded), value=None)

    def on_pick(record_id: str | None, loaded: list[dict[str, Any]]) -> Any:
        record = next((r for r in loaded if str(r["id"]) == record_id), None)
        return record["question"] if record is not None else gr.skip()

    def on_check(url: str) -> str:
        from mmoa.webui.server_check import check_server, render_report

        return render_report(check_server(url))

    load_btn.click(on_load, [model_path, adapter_path, template], [status])
    check_btn.click(on_check, [retriever_url], [server_info])
    qa_load_btn.click(on_load_questions, [qa_file], [records, qa_pick])
    qa_pick.change(on_pick, [qa_pick, records], [question], queue=False)
    ask_inputs = [model_path, adapter_path, template, retriever_url, top_k, mode, question,
                  records]
    ask_outputs = [status, answer, subquestions, selection, timings, candidates, raw, gold]
    for trigger in (ask_btn.click, question.submit):
        trigger(clear_results, None, ask_outputs, queue=False).then(on_ask, ask_inputs,
                                                                    ask_outputs)
    return {"model_path": model_path, "adapter_path": adapter_path, "template": template,
            "load_btn": load_btn, "retriever_url": retriever_url, "top_k": top_k, "mode": mode,
            "check_btn": check_btn, "server_info": server_info, "qa_file": qa_file,
            "qa_load_btn": qa_load_btn, "qa_pick": qa_pick, "records": records,
            "status": status, "question": question, "ask_btn": ask_btn, "answer": answer,
            "gold": gold, "subquestions": subquestions, "selection": selection,
            "timings": timings, "candidates": candidates, "raw": raw}
