"""The README's first command as a new user runs it: a fresh clone of this repository and a fresh data folder, the
command taken verbatim from the README, timed step by step (each ``&&`` step of it) until the demo serves its
report ("[6/6] serving"), then stopped. The demo's own phases ("[1/6]" .. "[6/6]") are timed from its output.

What is warm, as on any machine that ran it once: pip's download cache and specroute's llama.cpp build
(``~/.cache/specroute/llama-server``), which ``specroute llama-server build`` reuses; everything else (the
virtual environment, the installs, the data folder, the analysis, the classifier) is made from nothing.

    python benchmarks/first_command.py

Writes benchmarks/results/first_command.json and rewrites benchmarks/README.md. Run it with nothing else on the
machine; every figure is for the CPU model it prints.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analyzer.models.devices import cpu_model_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVING = "[6/6] serving"
STEP_MARK = "@@step"


def first_command(readme: str) -> str:
    """The README's first command: the shell block under "**1. Set up and run the main job**"."""
    match = re.search(r"\*\*1\. Set up and run the main job\*\*.*?```sh\n(.+?)\n```", readme, flags=re.S)
    if match is None:
        raise ValueError("README.md has no '**1. Set up and run the main job**' block")
    return match.group(1).strip()


def marked(command: str) -> str:
    """The command with a line before each of its ``&&`` steps naming it, so the steps can be timed from the
    output (one shell, so the virtual environment each step activates stays active)."""
    steps = [step.strip() for step in command.split(" && ")]
    return " && ".join(f"echo '{STEP_MARK} {i}' && {step}" for i, step in enumerate(steps))


def steps_of(command: str) -> list[str]:
    return [step.strip() for step in command.split(" && ")]


def timed_lines(command: str, cwd: Path, env: dict[str, str], timeout_s: float) -> list[tuple[float, str]]:
    """Run ``command`` in bash and return every output line with the seconds since its start, until the demo
    says it serves (then the whole process group is stopped) or the command ends. SystemExit where it fails
    or runs past ``timeout_s``."""
    started = time.perf_counter()
    process = subprocess.Popen(
        ["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[tuple[float, str]] = []
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    try:
        while True:
            if time.perf_counter() - started > timeout_s:
                raise SystemExit(f"the first command ran past {timeout_s:.0f} s; last lines: {lines[-5:]}")
            if not selector.select(timeout=5):
                continue
            line = process.stdout.readline()
            if not line:
                break
            lines.append((time.perf_counter() - started, line.rstrip("\n")))
            if line.startswith(SERVING):
                return lines
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    if process.wait() != 0:
        raise SystemExit(f"the first command failed ({process.returncode}); last lines: {lines[-20:]}")
    raise SystemExit("the first command ended without the demo serving its report")


def phases(lines: list[tuple[float, str]], steps: list[str]) -> tuple[list[dict], list[dict]]:
    """Per step of the command and per phase of the demo ("[k/6] ..."), its seconds: from its first line to
    the next one's (the last step and phase end at the serving line)."""
    end = lines[-1][0]
    step_starts = [(t, int(line.split()[1])) for t, line in lines if line.startswith(STEP_MARK)]
    step_rows = [
        {"step": steps[number], "seconds": (step_starts[i + 1][0] if i + 1 < len(step_starts) else end) - t}
        for i, (t, number) in enumerate(step_starts)
    ]
    demo = [(t, line) for t, line in lines if re.match(r"^\[\d/6\] ", line)]
    demo_rows = [
        {"phase": line[:120], "seconds": (demo[i + 1][0] if i + 1 < len(demo) else end) - t}
        for i, (t, line) in enumerate(demo)
    ]
    return step_rows, demo_rows


def main() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = first_command(readme)
    machine = f"{cpu_model_name()}, {os.cpu_count()} CPUs"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"the README's first command on a fresh clone of {commit}, {machine}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="specroute-first-"))
    try:
        clone, data = work / "clone", work / "data"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
        env["SPECROUTE_DATA_DIR"] = str(data)
        lines = timed_lines(marked(command), clone, env, timeout_s=3600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    step_rows, demo_rows = phases(lines, steps_of(command))
    for row in step_rows + demo_rows:
        print(f"{row['seconds']:8.1f} s  {row.get('step') or row.get('phase')}", flush=True)
    result = {
        "machine": machine,
        "commit": commit,
        "seconds": lines[-1][0],
        "steps": step_rows,
        "demo": demo_rows,
        "warm": "pip's download cache and the llama.cpp build (~/.cache/specroute/llama-server)",
        "command": "python benchmarks/first_command.py",
    }
    print(f"until the demo serves: {result['seconds']:.0f} s", flush=True)
    out = HERE / "results" / "first_command.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    sys.path.insert(0, str(HERE))
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    print(f"rewrote {write_readme()}")


if __name__ == "__main__":
    main()
