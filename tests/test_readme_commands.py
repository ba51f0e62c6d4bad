"""Every command that README.md shows runs: each ``mmoa-cli ...``, ``python <script>.py``,
``python -m <module>`` and ``bash <script>.sh`` of this repository in its code blocks answers
``--help`` with exit 0 (issue 45). Nothing is trained: only ``--help`` is run.

The README is parsed as it is, so the test follows its rewrites: fenced code blocks, ``\\``
continuations joined, comments and ``$ `` prompts dropped, ``cd DIR &&`` followed, ``VAR=value``
prefixes and pipes handled. Placeholders (``<...>``, ``$VAR``, ``...``) in a script's path are
skipped; a script path that names nothing in the repository fails. For ``mmoa-cli`` the
command path (``data sft``) is checked in process, and so is every ``--option`` the README
gives it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Separators of the commands on one shell line.
SEPARATORS = {"&&", "||", ";", "|"}
#: A path that is not meant literally.
PLACEHOLDER = re.compile(r"[<>{}$*]|\.\.\.|/path/to/", re.IGNORECASE)
PYTHONS = {"python", "python3"}
TIMEOUT = 120


@dataclass(frozen=True)
class Command:
    """One README command: ``kind`` is ``cli`` (``mmoa-cli``), ``script`` (python file),
    ``module`` (``python -m``) or ``shell`` (bash file); ``target`` the file or module;
    ``argv`` what follows it; ``cwd`` where the README runs it."""

    kind: str
    target: str
    argv: tuple[str, ...]
    cwd: Path
    line: str

    @property
    def id(self) -> str:
        where = "" if self.cwd == ROOT else f"(cd {self.cwd.relative_to(ROOT)}) "
        if self.kind == "cli":
            return where + " ".join(["mmoa-cli", *cli_path(self.argv)])
        return where + f"{self.kind} {self.target}"


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text (any language tag)."""
    return re.findall(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", text, re.MULTILINE | re.DOTALL)


def _split(tokens: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def commands_in(text: str) -> list[Command]:
    """The repository commands of the README's code blocks, in order, without repeats."""
    found: dict[str, Command] = {}
    for block in code_blocks(text):
        for raw in re.sub(r"\\\n", " ", block).splitlines():
            line = raw.strip().removeprefix("$ ")
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError:  # not shell (a table, a diagram with a stray quote)
                continue
            cwd = ROOT
            for part in _split(tokens):
                while part and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", part[0]):
                    part = part[1:]  # VAR=value prefix
                if not part:
                    continue
                if part[0] == "cd" and len(part) > 1:
                    cwd = (cwd / part[1]).resolve()
                    continue
                command = _classify(part, cwd, line)
                if command is not None:
                    found.setdefault(command.id, command)
    return list(found.values())


def _classify(part: list[str], cwd: Path, line: str) -> Command | None:
    head, rest = part[0], part[1:]
    if head == "mmoa-cli":
        return Command("cli", "mmoa-cli", tuple(rest), cwd, line)
    if head in PYTHONS and rest:
        if rest[0] == "-m" and len(rest) > 1:
            if rest[1] == "mmoa.cli":
                return Command("cli", "mmoa-cli", tuple(rest[2:]), cwd, line)
            return Command("module", rest[1], tuple(rest[2:]), cwd, line)
        if rest[0].endswith(".py"):
            return Command("script", rest[0], tuple(rest[1:]), cwd, line)
        return None  # python -c, python - <<EOF, ...
    if head in ("bash", "sh") and rest and rest[0].endswith(".sh"):
        return Command("shell", rest[0], tuple(rest[1:]), cwd, line)
    if head.startswith("./") and head.endswith((".sh", ".py")):
        return Command("shell" if head.endswith(".sh") else "script", head, tuple(rest), cwd,
                       line)
    return None


def cli_path(argv: tuple[str, ...]) -> list[str]:
    """The sub-command words of an ``mmoa-cli`` command line (``data sft``)."""
    from mmoa.cli import build_parser

    parser, path = build_parser(), []
    for token in argv:
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs or token not in subs[0].choices:
            break
        parser = subs[0].choices[token]
        path.append(token)
    return path


COMMANDS = commands_in(README.read_text(encoding="utf-8")) if README.is_file() else []


def test_the_readme_shows_commands() -> None:
    """The parser finds the README's commands at all (else every other test would pass on
    nothing): at least the demo's."""
    assert any(c.kind == "shell" and c.target.endswith("run_demo.sh") for c in COMMANDS), \
        [c.id for c in COMMANDS]


def test_the_parser_reads_shell_lines() -> None:
    text = ("```bash\n$ cd LLaMA-Factory && bash run_sft.sh CONFIG.yaml   # comment\n"
            "MODEL=tiny bash run_demo.sh\nmmoa-cli data sft --data_file x \\\n    --k 5\n"
            "python -m mmoa.precision auto | tee log\npython - <<'EOF'\npip install x\n```\n")
    found = {c.id: c for c in commands_in(text)}
    assert set(found) == {"(cd LLaMA-Factory) shell run_sft.sh", "shell run_demo.sh",
                          "mmoa-cli data sft", "module mmoa.precision"}
    assert found["mmoa-cli data sft"].argv == ("data", "sft", "--data_file", "x", "--k", "5")


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "LLaMA-Factory" / "src"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "GRADIO_ANALYTICS_ENABLED": "False"}


def _check_cli(command: Command) -> None:
    from mmoa.cli import build_parser, main

    path = cli_path(command.argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0, f"{command.line}: mmoa-cli {' '.join(path)} --help"
    assert out.getvalue().startswith("usage: ")
    parser = build_parser()
    for word in path:
        parser = next(a for a in parser._actions
                      if a.__class__.__name__ == "_SubParsersAction").choices[word]
    known = set(parser._option_string_actions)
    for token in command.argv[len(path):]:
        option = token.split("=", 1)[0]
        if option.startswith("--") and not PLACEHOLDER.search(option):
            assert option in known, f"{command.line}: mmoa-cli {' '.join(path)} has no {option}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_every_readme_command_answers_help(command: Command) -> None:
    if command.kind == "cli":
        _check_cli(command)
        return
    if command.kind == "module":
        argv = [sys.executable, "-m", command.target, "--help"]
    else:
        if PLACEHOLDER.search(command.target):
            pytest.skip(f"placeholder path: {command.target}")
        path = (command.cwd / command.target).resolve()
        assert path.is_file(), f"{command.line}: {command.target} is not a file of the repository"
        runner = [sys.executable] if command.kind == "script" else ["bash"]
        argv = [*runner, str(path), "--help"]
    result = subprocess.run(argv, cwd=command.cwd, env=_env(), capture_output=True, text=True,
                            timeout=TIMEOUT, check=False)
    output = result.stdout[-1500:] + result.stderr[-1500:]
    assert result.returncode == 0, f"{command.line}:\n{output}"
    assert result.stdout.strip(), f"{command.line}: --help printed nothing"
