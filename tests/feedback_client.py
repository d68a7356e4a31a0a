"""What tests/test_concurrency.py's eight client processes run: one writer of feedback events over HTTP. A
module of its own so that each spawned process imports numpy and the standard library only (0.2 s), not the
concurrency tests' module with the router's models and the test factories (1.2 s; eight processes on 2
cores)."""

from __future__ import annotations

import http.client
import json

import numpy as np

TASKS = ("code", "qa", "summarization", "translation")
POSTS = 1000


def post(connection: http.client.HTTPConnection, path: str, payload: dict) -> tuple[int, dict]:
    """POST ``payload`` as JSON to ``path``; (status, decoded body)."""
    connection.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def feedback_writer(port: int, seed: int, out) -> None:
    """One writer: POSTS feedback events with seeded random counts; puts its per-task sums (events,
    rounds, drafted, accepted), its first five errors and how many there were on ``out``."""
    rng = np.random.default_rng(seed)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    sums = {t: [0, 0, 0, 0] for t in TASKS}
    errors = []
    for _ in range(POSTS):
        task = TASKS[int(rng.integers(len(TASKS)))]
        rounds = int(rng.integers(1, 40))
        drafted = int(rng.integers(0, 4 * rounds + 1))
        accepted = int(rng.integers(0, drafted + 1))
        status, body = post(
            connection,
            "/v1/feedback",
            {"task_type": task, "rounds": rounds, "drafted": drafted, "accepted": accepted},
        )
        if status != 200:
            errors.append((status, body))
            continue
        for i, value in enumerate((1, rounds, drafted, accepted)):
            sums[task][i] += value
    out.put((sums, errors[:5], len(errors)))
