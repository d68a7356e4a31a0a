"""Whether an adapted task classifier version becomes active: the check against the active version
(too few confident pseudo-labels, worse on the same held-out folds, or not compared with it), the verdict
kept in the new version's scores, and that verdict in words with both versions' numbers."""

from __future__ import annotations

from typing import Any

from router.classify.evaluation import regressions
from router.classify.training_data import TrainingData, pseudo_label_support
from router.orm import ClassifierVersion


def activation_check(data: TrainingData, scores: dict, active: ClassifierVersion | None) -> dict:
    """Why an adapted version (trained on ``data``, cross-validated into ``scores``) must not replace
    ``active``: too few confident pseudo-labels, worse than it on the same held-out folds
    (``scores["comparison"]``), or no comparison at all (not cross-validated, or the active recipe
    could not be fitted). ``{"previous": active version or None, "reasons": [...], "pseudo": ...,
    "comparison": ...}``; no reasons when nothing is active (nothing to keep)."""
    support = pseudo_label_support(data)
    comparison = scores.get("comparison")
    check: dict[str, Any] = {"previous": None, "reasons": [], "pseudo": support, "comparison": None}
    if active is None:
        return check
    check["previous"] = active.version
    reasons = [support["too_few"]] if support["too_few"] else []
    if comparison and "problem" not in comparison:
        comparison = comparison | {
            # the active version's own data (it added no labels since) or its recipe on today's labels
            "same_data": active.training_data_sha256 == data.without_pseudo_labels().sha256,
            "active_adapted": "adaptation" in (active.scores or {}),
        }
        check["comparison"] = comparison
        worse = regressions(comparison["adapted"], comparison["active"])
        if worse:
            reasons.append(f"worse than v{active.version}: " + "; ".join(worse))
    elif support["count"]:
        why = (
            comparison["problem"]
            if comparison
            else "not cross-validated"
            if "macro_f1" not in scores
            else "fewer than two tasks could be learnt on its folds"
        )
        reasons.append(f"not compared with v{active.version} on the same held-out folds ({why})")
    check["reasons"] = reasons
    return check


def settle_activation(
    data: TrainingData, scores: dict[str, Any], active: ClassifierVersion | None, force_activate: bool
) -> bool:
    """Whether the adapted version becomes active (:func:`activation_check`, or ``force_activate``);
    the verdict goes into ``scores["activation"]``, with the comparison it was made on."""
    check = activation_check(data, scores, active)
    scores.pop("comparison", None)  # kept, with what it compared, in the check
    withheld = bool(check["reasons"])
    scores["activation"] = check | {
        "activated": not withheld or force_activate,
        "forced": withheld and force_activate,
    }
    return scores["activation"]["activated"]


def activation_message(version: ClassifierVersion) -> str | None:
    """What became of an adapted version, in a line or two with both versions' numbers: activated
    (better or no worse than the active one on the same folds, or nothing was active), activated by
    force despite the reasons, or NOT activated and why. None for a version trained without adapting."""
    check = (version.scores or {}).get("activation")
    if check is None:
        return None
    previous, reasons, comparison = check["previous"], check["reasons"], check["comparison"]
    if previous is None:
        head = f"classifier v{version.version} activated: no version was active to compare it with"
    elif not check["activated"]:
        head = f"classifier v{version.version} NOT activated (v{previous} stays active): " + "; ".join(
            reasons
        )
    elif check["forced"]:
        head = f"classifier v{version.version} activated because you forced it, although: " + "; ".join(
            reasons
        )
    else:
        head = f"classifier v{version.version} activated: no worse than v{previous}"
    if comparison:
        head += (
            f". Same {comparison['folds']} {comparison['on']} folds ({comparison['prompts']} labelled "
            f"prompts): macro-F1 {comparison['adapted']['macro_f1']:.3f} adapted vs "
            f"{comparison['active']['macro_f1']:.3f} for v{previous}"
            + (
                " re-trained fold by fold on its own training data"
                if comparison["same_data"] and not comparison["active_adapted"]
                else f"'s recipe ({comparison['features']}, C {comparison['C']:g}) re-trained fold by fold "
                "on today's labelled prompts, without pseudo-labels"
            )
        )
    return head
