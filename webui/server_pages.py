"""llama-server analysis pages: the stored analyses, and one analysis' report: its step costs, predicted vs
measured per drafter setting (with the share whose draft counts equal the replay's), the drafter comparison
per task with the chosen setting, and the pools those choices need with their command lines."""

from __future__ import annotations

from flask import current_app, redirect, render_template, url_for

from analyzer.analysis.server_store import (
    get_server_analysis,
    list_server_analyses,
    pool_plan,
    pool_plan_text,
)
from analyzer.analysis.server_text import cost_text, decision_text, divergence_text, noise_text
from analyzer.db import lock_for_write
from analyzer.pricing.speedup import INTERVAL_LEVEL, MIN_TASK_PROMPTS
from analyzer.run_params import DEFAULT_MARGIN
from router.policy import PolicyError
from router.server_policy import publish_server_policies
from webui.plots import scatter
from webui.ui import bp, flash, sessions


@bp.get("/llama-server")
def server_analyses():
    with sessions()() as session:
        rows = [
            {
                "id": r.id,
                "set": r.prompt_set.name,
                "prompts": len(r.prompts),
                "drafters": ", ".join(r.drafters),
                "created_at": r.created_at.strftime("%Y-%m-%d %H:%M UTC"),
            }
            for r in list_server_analyses(session)
        ]
    return render_template("server_analyses.html", rows=rows)


@bp.get("/llama-server/<int:analysis_id>")
def server_analysis(analysis_id: int):
    with sessions()() as session:
        record = get_server_analysis(session, analysis_id)
        points = [
            (
                s.get("validated_prediction") or s["predicted_speedup"],
                s["measured_speedup"],
                f"{s['setting']} · prompt {p['prompt_id']}",
            )
            for p in record.prompts
            for s in p["settings"]
            if s["measured_speedup"] is not None and not s["calibration"] and s.get("counts_equal")
        ]
        plot = scatter(
            "Predicted vs measured speedup per prompt and setting",
            points,
            x_label="predicted (replay of the served output + fitted step costs)",
            y_label="measured (llama-server timings)",
            note="validated prompts, each priced from the replay of the output its server served",
        ) if points else None  # fmt: skip
        tasks = [
            {
                **t,
                "best_value": max(t["predicted"].values()) if t["predicted"] else None,
                "rule": decision_text(t),
            }
            for t in record.tasks
        ]
        page = render_template(
            "server_analysis.html",
            record=record,
            set_name=record.prompt_set.name,
            tasks=tasks,
            plan=pool_plan(record),
            plan_text=pool_plan_text(record, 8081),
            plot=plot,
            cost_lines={family: cost_text(cost) for family, cost in record.cost.items()},
            noise_line=noise_text(record.noise),
            divergence_line=divergence_text(record.validation),
            rule={"bar": 1 + DEFAULT_MARGIN, "level": INTERVAL_LEVEL, "min_prompts": MIN_TASK_PROMPTS},
        )
    return page


@bp.post("/llama-server/<int:analysis_id>/publish")
def publish_server_analysis(analysis_id: int):
    """Publish the analysis' choices as the active policy set (its pools on this machine from port 8081, or
    where SPECROUTE_ROUTER_POOLS names them) and reload the router; then the policies page."""
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)  # read-then-write: wait for the decision log instead of failing
            policy_set = publish_server_policies(session, analysis_id)
            version, active = policy_set.version, policy_set.is_active
    except PolicyError as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.server_analysis", analysis_id=analysis_id))
    current_app.extensions["specroute.router"].reload()
    if not active:
        flash(
            f"policy set v{version} published from llama-server analysis #{analysis_id} but NOT activated: its "
            f"advice is withheld (see the analysis page); 'specroute policies activate {version}' routes with it "
            "anyway",
            "error",
        )
        return redirect(url_for("ui.policies"))
    flash(
        f"policy set v{version} published from llama-server analysis #{analysis_id} and active: start its pools "
        "with 'specroute pools start'"
    )
    return redirect(url_for("ui.policies"))
