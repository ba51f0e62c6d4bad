"""The RAG Playground tab: one question through QR -> Retriever -> Selector -> Generator.

A researcher looking at a checkpoint wants to see *why* an answer came out: which sub-questions
the Query Rewriter wrote, which documents the retriever returned for each (with their corpus
ids), which of them the Selector kept, what the Generator answered, and how long each agent
took. The tab runs the same :class:`~mmoa.agents.pipeline.RagPipeline` as evaluation and MAPPO
rollouts (greedy decoding, the same prompts), so what it shows is what the metrics measure.

Whatever the model writes is shown as it is: an untrained model's sub-questions may be empty (the
pipeline then searches with the question itself) and its selection may be empty.
"""

from __future__ import annotations

import html
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmoa.agents.pipeline import MODES, Trace

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
                self.model, self.tokenizer = load_for_inference(
                    key.model_path, key.template, key.adapter_path or None)
                self.key = key
                seconds = time.perf_counter() - start
                return f"loaded {_describe(key)} in {seconds:.1f} s"
        # The session is the UI's, shared by every page open on it.
        return f"using {_describe(key)} (loaded earlier in this web UI)"

    def ask(self, question: str, retriever_url: str, top_k: Any, mode: str) -> PlaygroundAnswer:
        from mmoa.agents.pipeline import RagPipeline
        from mmoa.retrieval.client import RetrievalClient

        question = question.strip()
        if not question:
            raise ValueError("type a question")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        top_k = top_k_count(top_k)
        with self.lock:
            if self.key is None:
                raise ValueError("load a model first")
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
    if answer.mode not in ("qr_g", "qr_s_g"):
        note = "no Query Rewriter in this mode: the question itself is searched"
    elif trace.qr_parse is not None and trace.qr_parse.empty:
        note = "the Query Rewriter wrote no usable sub-question: the question itself is searched"
    else:
        note = ""
    items = "".join(f"<li>{html.escape(s)}</li>" for s in trace.subquestions)
    note_html = f'<p class="mmoa-note"><em>{html.escape(note)}</em></p>' if note else ""
    return f'<div id="mmoa-subquestions-list">{note_html}<ol>{items}</ol></div>'


def render_candidates(answer: PlaygroundAnswer) -> str:
    trace = answer.trace
    if not trace.candidates:
        return '<div id="mmoa-candidates-table"><p><em>no retrieval in this mode</em></p></div>'
    selected = set(trace.selected)
    head = "".join(f'<th style="{_CELL_STYLE}">{h}</th>'
                   for h in ("#", "doc id", "title", "sub-question", "rank", "selected"))
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
        rows.append(f'<tr {row_attrs} data-index="{index}">'
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


#: answer, sub-questions, selection, timings, candidates, raw trace
EMPTY_RESULTS: tuple[Any, ...] = ("", "", "", "", "", None)


def ask_for_page(session: PlaygroundSession, path: str, adapter: str, template: str, url: str,
                 top_k: float, mode: str, question: str) -> tuple[Any, ...]:
    """The tab's outputs for one question: status, answer, sub-questions, selection, timings,
    candidates and raw trace; a failure (no model, no server, bad input) is the status line,
    with every result field empty, so nothing of an earlier question is left on screen."""
    try:
        loaded = session.load(path, adapter or "", template or "")
        result = session.ask(question, url, top_k, mode)
    except (ValueError, OSError, RuntimeError) as err:  # includes retriever errors
        return (f"{ERROR_PREFIX}{err}", *EMPTY_RESULTS)
    status_line = (f"{loaded}; answered in {result.total_seconds:.2f} s "
                   f"({len(result.trace.candidates)} candidates)")
    return (status_line, result.trace.answer, render_subquestions(result),
            render_selection(result), render_timings(result), render_candidates(result),
            result.trace.to_dict())


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
                                   elem_id="mmoa-pg-retriever_url")
        top_k = gr.Number(label="Top-K", value=10, precision=0, minimum=1, scale=1,
                          elem_id="mmoa-pg-top_k")
        mode = gr.Dropdown(label="Mode", choices=list(MODES), value="qr_s_g", scale=1,
                           elem_id="mmoa-pg-mode")
    status = gr.Textbox(label="Status", interactive=False, elem_id="mmoa-pg-status")
    with gr.Row():
        question = gr.Textbox(label="Question", scale=5, elem_id="mmoa-pg-question",
                              placeholder="e.g. Who founded the city where X was born?")
        ask_btn = gr.Button("Ask", variant="primary", scale=1, elem_id="mmoa-pg-ask")
    with gr.Row():
        with gr.Column(scale=2):
            answer = gr.Textbox(label="Answer (Generator)", interactive=False,
                                elem_id="mmoa-pg-answer")
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

    load_btn.click(on_load, [model_path, adapter_path, template], [status])
    ask_inputs = [model_path, adapter_path, template, retriever_url, top_k, mode, question]
    ask_outputs = [status, answer, subquestions, selection, timings, candidates, raw]
    for trigger in (ask_btn.click, question.submit):
        trigger(clear_results, None, ask_outputs, queue=False).then(on_ask, ask_inputs,
                                                                    ask_outputs)
    return {"model_path": model_path, "adapter_path": adapter_path, "template": template,
            "load_btn": load_btn, "retriever_url": retriever_url, "top_k": top_k, "mode": mode,
            "status": status, "question": question, "ask_btn": ask_btn, "answer": answer,
            "subquestions": subquestions, "selection": selection, "timings": timings,
            "candidates": candidates, "raw": raw}
