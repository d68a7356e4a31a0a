"""Publishing any analysis by its reference (``7``, ``llama-server:3``, ``llama-server-job:2``), the one entry
``specroute policies publish --analysis`` uses: the analysis' kind picks how its decisions become a policy set
(:func:`router.policies.policy.publish_policies` for a run's gammas,
:func:`router.policies.server_policy.publish_server_policies` for an analysis' llama-server settings), and the
caller gets the set and, where it was not activated for it, why its advice is withheld."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from analyzer.advice.report import run_advice_withheld
from analyzer.analysis.analysis_ref import RUN, AnalysisRef, resolve_analysis
from analyzer.analysis.server_store import get_server_analysis
from analyzer.orm import AnalysisRun
from router.orm import PolicySet
from router.policies.policy import publish_policies
from router.policies.server_policy import DEFAULT_FIRST_PORT, publish_server_policies


@dataclass(frozen=True)
class Published:
    """A new policy set and why its analysis' advice is withheld (None: it is not, or activation was not left
    to the analysis), which is why the set is not active."""

    policy_set: PolicySet
    withheld: str | None


def publish_analysis(
    session: Session,
    ref: AnalysisRef,
    *,
    notes: str | None = None,
    activate: bool | None = None,
    first_port: int = DEFAULT_FIRST_PORT,
) -> Published:
    """A new policy set from the analysis ``ref`` names (a job's: the analysis it stored), stored with the next
    version; ``activate`` None activates it unless the analysis' advice is withheld, True or False decide
    regardless. ``first_port``: where the pools of an analysis' drafter settings serve when
    SPECROUTE_ROUTER_POOLS does not name them (a run's set names its pools by gamma)."""
    ref = resolve_analysis(session, ref)
    if ref.kind == RUN:
        policy_set = publish_policies(session, ref.id, notes=notes, activate=activate)
        run = session.get(AnalysisRun, ref.id)  # there: publishing found it
        withheld = run_advice_withheld(run) if run is not None and activate is None else None
    else:
        policy_set = publish_server_policies(
            session, ref.id, notes=notes, activate=activate, first_port=first_port
        )
        reason = get_server_analysis(session, ref.id).advice_withheld if activate is None else None
        withheld = f"Advice withheld: {reason}." if reason else None
    return Published(policy_set, withheld)
