"""Where the test suite's CPU goes: a pytest plugin that writes, per test, its wall time, the CPU seconds of its
process and the children it reaped (``resource.getrusage``), and the whole machine's busy CPU seconds over it
(``/proc/stat``, every process: servers, browsers and worker pools a test drives but does not reap), slowest
first, into CPU_PER_TEST_OUT (default test-artifacts/cpu_per_test.txt, which git ignores). Under pytest-xdist
each worker writes its own file (the worker's name appended).

    python -m pytest -q -p benchmarks.cpu_per_test -m "slow and not parallel"
    CPU_PER_TEST_OUT=/tmp/par.txt python -m pytest -q -n 2 -p benchmarks.cpu_per_test -m "not slow or parallel"

It shows whether the suite is bound by CPU or by waiting; the suite's times are in benchmarks/README.md,
"The build and the test suite".
"""

from __future__ import annotations

import os
import resource
import time

import pytest

_ROWS: list[tuple[float, float, float, str]] = []


def _own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has reaped."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every core; /proc/stat's first line, idle and iowait
    left out); 0.0 where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, own, busy = time.perf_counter(), _own_cpu_s(), _machine_busy_s()
    yield
    wall = time.perf_counter() - wall
    _ROWS.append((wall, _own_cpu_s() - own, _machine_busy_s() - busy, item.nodeid))


def pytest_sessionfinish(session):
    path = os.environ.get("CPU_PER_TEST_OUT", "test-artifacts/cpu_per_test.txt")
    path += os.environ.get("PYTEST_XDIST_WORKER", "")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as out:
        out.write("wall_s\town_cpu_s\tmachine_busy_s\tcores\ttest\n")
        for wall, own, busy, node in sorted(_ROWS, reverse=True):
            out.write(f"{wall:.1f}\t{own:.1f}\t{busy:.1f}\t{busy / wall if wall else 0.0:.2f}\t{node}\n")
