"""The log of routing decisions (table ``route_decisions``), written off the request path.

Answering a route request must not wait for a database write, so decisions are ``put`` into a
:class:`router.serve.batch_writer.BatchWriter`, whose thread stores every decision queued by then in one
transaction (group commit, at most ``batch_size`` rows), lingering up to ``linger_s`` (50 ms) after the first
for more to join it, so that under load a transaction carries many decisions instead of one or two;
feedback does not read the log (its ``route_id`` names the policy set and task). When ``max_queued``
decisions wait (the database cannot keep up), new ones are dropped from the log, counted, and still
answered; so are the decisions of a batch the database refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import Table, insert
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write, utcnow
from router.decide.contract import Decision
from router.orm import RouteDecision
from router.serve.batch_writer import BatchWriter

# the decisions' table as Core sees it (typed as a Table whatever the mapping's stub says of __table__)
_DECISIONS: Table = RouteDecision.metadata.tables[RouteDecision.__tablename__]

LINGER_S = 0.05  # how long the writer waits for more decisions to store in one transaction


class DecisionLog:
    """Queue decisions with ``add``; a daemon thread stores them. ``close`` stores what is left.
    ``written`` counts the stored decisions, ``dropped`` those lost (queue full, or not stored)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        max_queued: int = 100_000,
        batch_size: int = 2_000,
        on_drop: Callable[[int], None] | None = None,
        linger_s: float = LINGER_S,
    ):
        self._sessions = sessions
        self._writer: BatchWriter[dict, None] = BatchWriter(
            self._store,
            name="routing decisions",
            max_batch=batch_size,
            max_queued=max_queued,
            on_lost=on_drop,
            linger_s=linger_s,
        )

    @property
    def written(self) -> int:
        return self._writer.stored

    @property
    def dropped(self) -> int:
        return self._writer.dropped + self._writer.failed

    def add(
        self, decisions: Sequence[Decision], *, policy_set_id: int | None, classifier_version_id: int | None
    ) -> None:
        """Queue decisions for storage (never blocks)."""
        now = utcnow()
        self._writer.put(
            {
                "route_id": d.route_id,
                "policy_set_id": policy_set_id,
                "classifier_version_id": classifier_version_id,
                "task_type": d.task_type[:64],
                "confidence": d.confidence,
                "speculate": d.speculate,
                "gamma": d.gamma,
                "expected_speedup": d.expected_speedup,
                "reasons": [r.as_dict() for r in d.reason_codes],
                "created_at": now,
            }
            for d in decisions
        )

    def flush(self) -> None:
        """Wait until every decision queued so far is stored."""
        self._writer.flush()

    def close(self) -> None:
        """Store what is queued and stop the thread."""
        self._writer.close()

    def _store(self, rows: list[dict]) -> list[None]:
        with self._sessions() as session, session.begin():
            lock_for_write(session)  # queue with the other writers (a file lock on SQLite)
            # the table's own INSERT, many rows in one statement: the ORM's bulk insert walks each row in Python
            # first, which under load cost the server about a tenth of its CPU (benchmarks/profile_router.py)
            session.execute(insert(_DECISIONS), rows)
        return [None] * len(rows)
