"""Counters and latency histograms of the routing service, rendered in the Prometheus text format
(version 0.0.4) for ``GET /metrics``. Thread-safe: the production server answers on several threads.

Exposed series:
- ``specroute_http_requests_total{endpoint, method, status}``
- ``specroute_http_request_duration_seconds{endpoint}`` (histogram)
- ``specroute_route_decisions_total{task, outcome}`` with outcome ``speculate`` or ``off``
- ``specroute_feedback_events_total{task, engine}``
- ``specroute_feedback_drafted_tokens_total{task}`` and ``specroute_feedback_accepted_tokens_total{task}``
  (their ratio is the acceptance the engines report)
- ``specroute_task_alpha_estimate{task}``: the current online estimate of alpha per task
- ``specroute_decision_log_dropped_total``: decisions not logged because the log queue was full
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _escape(value: str) -> str:
    """A label value escaped as the text format wants it (backslash, newline, double quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    """A series' label set, ``{name="value",...}``."""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


class Metrics:
    """The service's metrics; ``render()`` gives the exposition text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self._latency_buckets: dict[str, list[int]] = {}
        self._latency_sum: dict[str, float] = defaultdict(float)
        self._latency_count: dict[str, int] = defaultdict(int)
        self._decisions: dict[tuple[str, str], int] = defaultdict(int)
        self._feedback: dict[tuple[str, str], int] = defaultdict(int)
        self._drafted: dict[str, int] = defaultdict(int)
        self._accepted: dict[str, int] = defaultdict(int)
        self._alpha: dict[str, float] = {}
        self._dropped = 0

    def observe_request(self, endpoint: str, method: str, status: int, duration_s: float) -> None:
        """Count one HTTP request and its latency."""
        with self._lock:
            self._requests[(endpoint, method, str(status))] += 1
            buckets = self._latency_buckets.setdefault(endpoint, [0] * (len(LATENCY_BUCKETS_S) + 1))
            buckets[bisect.bisect_left(LATENCY_BUCKETS_S, duration_s)] += 1
            self._latency_sum[endpoint] += duration_s
            self._latency_count[endpoint] += 1

    def observe_decisions(self, decisions) -> None:
        """Count routing decisions by task and outcome."""
        with self._lock:
            for decision in decisions:
                self._decisions[(decision.task_type, "speculate" if decision.speculate else "off")] += 1

    def observe_feedback(self, task: str, engine: str, drafted: int, accepted: int, alpha: float) -> None:
        """Count one feedback event and record the task's new alpha estimate."""
        with self._lock:
            self._feedback[(task, engine)] += 1
            self._drafted[task] += drafted
            self._accepted[task] += accepted
            self._alpha[task] = alpha

    def observe_dropped(self, count: int = 1) -> None:
        """Count decisions the log dropped because its queue was full."""
        with self._lock:
            self._dropped += count

    def render(self) -> str:
        """The Prometheus text exposition of every series."""
        with self._lock:
            lines = self._request_lines() + self._latency_lines() + self._decision_lines()
            lines += self._feedback_lines() + self._alpha_lines()
            lines += [
                "# HELP specroute_decision_log_dropped_total Decisions not logged because the queue was full.",
                "# TYPE specroute_decision_log_dropped_total counter",
                f"specroute_decision_log_dropped_total {self._dropped}",
            ]
        return "\n".join(lines) + "\n"

    def _request_lines(self) -> list[str]:
        """The HTTP request counter (under the lock)."""
        lines = [
            "# HELP specroute_http_requests_total HTTP requests by endpoint, method and status.",
            "# TYPE specroute_http_requests_total counter",
        ]
        for (endpoint, method, status), n in sorted(self._requests.items()):
            lines.append(
                f"specroute_http_requests_total{_labels(endpoint=endpoint, method=method, status=status)} {n}"
            )
        return lines

    def _latency_lines(self) -> list[str]:
        """The request latency histogram (under the lock)."""
        lines = [
            "# HELP specroute_http_request_duration_seconds Time to answer, by endpoint.",
            "# TYPE specroute_http_request_duration_seconds histogram",
        ]
        for endpoint, buckets in sorted(self._latency_buckets.items()):
            cumulative = 0
            for bound, n in zip(LATENCY_BUCKETS_S + (float("inf"),), buckets):
                cumulative += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                labels = _labels(endpoint=endpoint, le=le)
                lines.append(f"specroute_http_request_duration_seconds_bucket{labels} {cumulative}")
            lines.append(
                f"specroute_http_request_duration_seconds_sum{_labels(endpoint=endpoint)} "
                f"{self._latency_sum[endpoint]:.6f}"
            )
            lines.append(
                f"specroute_http_request_duration_seconds_count{_labels(endpoint=endpoint)} "
                f"{self._latency_count[endpoint]}"
            )
        return lines

    def _decision_lines(self) -> list[str]:
        """The routing decision counter (under the lock)."""
        lines = [
            "# HELP specroute_route_decisions_total Routing decisions by task and outcome.",
            "# TYPE specroute_route_decisions_total counter",
        ]
        for (task, outcome), n in sorted(self._decisions.items()):
            lines.append(f"specroute_route_decisions_total{_labels(task=task, outcome=outcome)} {n}")
        return lines

    def _feedback_lines(self) -> list[str]:
        """The feedback event, drafted and accepted token counters (under the lock)."""
        lines = [
            "# HELP specroute_feedback_events_total Feedback events by task and engine.",
            "# TYPE specroute_feedback_events_total counter",
        ]
        for (task, engine), n in sorted(self._feedback.items()):
            lines.append(f"specroute_feedback_events_total{_labels(task=task, engine=engine)} {n}")
        for name, values, what in (
            ("drafted", self._drafted, "Draft tokens"),
            ("accepted", self._accepted, "Accepted draft tokens"),
        ):
            lines += [
                f"# HELP specroute_feedback_{name}_tokens_total {what} reported in feedback, by task.",
                f"# TYPE specroute_feedback_{name}_tokens_total counter",
            ]
            for task, n in sorted(values.items()):
                lines.append(f"specroute_feedback_{name}_tokens_total{_labels(task=task)} {n}")
        return lines

    def _alpha_lines(self) -> list[str]:
        """The per-task alpha estimate gauge (under the lock)."""
        lines = [
            "# HELP specroute_task_alpha_estimate Online estimate of the acceptance rate alpha, by task.",
            "# TYPE specroute_task_alpha_estimate gauge",
        ]
        for task, alpha in sorted(self._alpha.items()):
            lines.append(f"specroute_task_alpha_estimate{_labels(task=task)} {alpha:.6f}")
        return lines
