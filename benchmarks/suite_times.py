"""The build's and the test suite's times into benchmarks/results/suite.json, then benchmarks/README.md rewritten.

The tests' times are read from the log of one ``.ci/run`` on a clean clone with the llama.cpp build cached (its
two pytest passes' closing lines, ``N passed in S s``, and the whole run's wall time as ``/usr/bin/time -f
"CI_WALL %e"`` prints it); the build's time from ``specroute llama-server build``'s own closing line ("built ...
in M min S s"), in the log of a first build. Each run replaces the suite's figures; the machine is this one's:

    /usr/bin/time -f "CI_WALL %e" bash -c 'CI=1 bash .ci/run' > ci.log 2>&1
    python -m benchmarks.suite_times --ci-log ci.log --build-log build.log
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from analyzer.models.devices import cpu_model_name
from benchmarks.readme_tables import RESULTS, write_readme

TEST_COMMAND = (
    'python -m pytest -q -n 2 --dist worksteal -m "not slow or parallel" && '
    'python -m pytest -q -m "slow and not parallel"'
)


def pytest_passes(log: str) -> list[tuple[int, float]]:
    """(tests passed, seconds) of every pytest closing line in ``log``, in order."""
    return [
        (int(passed), float(seconds))
        for passed, seconds in re.findall(r"^=*\s*(\d+) passed(?:, [^\n]*?)? in ([\d.]+)s", log, flags=re.M)
    ]


def build_seconds(log: str) -> int:
    """The build's own closing line, "built ... in M min S s", in seconds."""
    match = re.search(r"^built .* in (\d+) min (\d+) s$", log, flags=re.M)
    if match is None:
        raise ValueError("no 'built ... in M min S s' line: give the log of a build that compiled")
    return int(match.group(1)) * 60 + int(match.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ci-log", type=Path, required=True, help="the log of CI=1 bash .ci/run, timed")
    parser.add_argument(
        "--build-log", type=Path, required=True, help="the log of specroute llama-server build"
    )
    args = parser.parse_args()
    ci_log = args.ci_log.read_text()
    passes = pytest_passes(ci_log)
    if len(passes) != 2:
        raise SystemExit(
            f"expected the test command's two pytest passes in {args.ci_log}, found {len(passes)}"
        )
    wall = re.search(r"^CI_WALL ([\d.]+)$", ci_log, flags=re.M)
    seconds = build_seconds(args.build_log.read_text())
    data = {
        "recorded": "one run of each on this machine",
        "machine": f"{cpu_model_name()}, {os.cpu_count()} cores, nothing else running",
        "build": {
            "what": "llama.cpp compiled once, for llama-server and llama-cpp-python (the llama.cpp that "
            "llama-cpp-python 0.3.36 vendors)",
            "command": "specroute llama-server build",
            "seconds_min": seconds,
            "seconds_max": seconds,
        },
        "tests": {
            "what": "the README's test command (its parallel pass, then its serial pass)",
            "command": TEST_COMMAND,
            "ci_command": "CI=1 bash .ci/run",
            "runs": [
                {
                    "tests": sum(n for n, _ in passes),
                    "tests_s": round(sum(s for _, s in passes)),
                    "ci_s": round(float(wall.group(1))) if wall else None,
                }
            ],
        },
    }
    (RESULTS / "suite.json").write_text(json.dumps(data, indent=1) + "\n")
    write_readme()


if __name__ == "__main__":
    main()
