"""One report page for every analysis: a run and a llama-server analysis render through one template
and one view code path (webui/report_page.py), each with its options, per task the curve over them with the
interval and the decision, and per prompt its options: the values its own report JSON holds."""

from __future__ import annotations

import html
import re
from contextlib import contextmanager

from flask import template_rendered

from analyzer.analysis.run_records import RunParams, create_run
from tests.factories import make_done_run, make_server_analysis


@contextmanager
def templates_rendered(app):
    """The names of the templates ``app`` renders (top level: what a view asked for) while the block runs."""
    names: list[str] = []

    def record(sender, template, context, **extra):
        names.append(template.name)

    template_rendered.connect(record, app)
    try:
        yield names
    finally:
        template_rendered.disconnect(record, app)


def _text(cell: str) -> str:
    """A cell's text, tags dropped and white space collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", cell))).strip()


def _table(page: str, table_id: str) -> str:
    start = page.index(f'id="{table_id}"')
    return page[start : page.index("</table>", start)]


def _rows(table: str, attribute: str) -> dict[str, list[list[str]]]:
    """The table's body rows by their ``attribute`` (several rows may share one value), each as its cells'
    texts."""
    rows: dict[str, list[list[str]]] = {}
    for key, row in re.findall(rf'<tr {attribute}="([^"]*)"[^>]*>(.*?)</tr>', table, re.S):
        rows.setdefault(key, []).append([_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)])
    return rows


def _option_headings(table: str) -> list[str]:
    return re.findall(r'<th class="option"(?: data-type="num")?>([^<]+)</th>', table)


def _cell(speedup: float, low: float | None = None, high: float | None = None) -> str:
    """A curve cell as the page writes it: ``1.62x``, with ``[1.44, 1.85]`` where the interval is known."""
    return f"{speedup:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None else "")


def _best(options: list[dict]) -> dict:
    """The option of the highest predicted speedup, the first among ties."""
    return max(enumerate(options), key=lambda pair: (pair[1]["predicted_speedup"], -pair[0]))[1]


def test_a_run_and_a_llama_server_analysis_render_through_one_template_with_their_own_numbers(
    app, session, client
):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2}, per_task=3)
    record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
    session.commit()
    with templates_rendered(app) as names:
        run_page = client.get(f"/runs/{run.id}").get_data(as_text=True)
        server_page = client.get(f"/llama-server/{record.id}").get_data(as_text=True)
    assert names == ["report.html", "report.html"]  # one page, not two
    run_data = client.get(f"/runs/{run.id}/report.json").get_json()
    server_data = client.get(f"/llama-server/{record.id}/report.json").get_json()

    # the header: engine, models, machine, prompt set, for either kind
    run_header = _text(run_page[run_page.index('id="analysis-header"') :].split("</p>")[0])
    assert "engine transformers · target hf:/models/target · draft hf:/models/draft · machine" in run_header
    server_header = _text(server_page[server_page.index('id="analysis-header"') :].split("</p>")[0])
    assert (
        "engine llama-server test · target /models/target.gguf · drafts ngram-simple 3/8, ngram-mod 16 2-16 · "
        f"machine {record.machine} · prompt set {run.prompt_set.name}, 6 prompts" in server_header
    )

    # per task, the curve over the run's gammas: S(g) at every g, the interval at g*, the decision
    gamma_max = run_data["params"]["gamma_max"]
    run_curves = _table(run_page, "curve-table")
    assert _option_headings(run_curves) == [f"gamma {g}" for g in range(1, gamma_max + 1)]
    rows = _rows(run_curves, "data-task")
    assert sorted(rows) == ["code", "qa"]
    for task, t in run_data["tasks"].items():
        (cells,) = rows[task]
        expected = [
            _cell(s, *(t["speedup_interval"] if g == t["best_gamma"] else (None, None)))
            for g, s in enumerate(t["speedup_curve"], start=1)
        ]
        assert cells[:2] == [task, str(t["n"])] and cells[2 : 2 + gamma_max] == expected
        assert cells[2 + gamma_max] == (f"gamma {t['best_gamma']}" if t["speculate"] else "off")
        assert cells[3 + gamma_max] == t["decision_reason"]
    assert (
        rows["code"][0][2 + gamma_max] == f"gamma {run_data['tasks']['code']['best_gamma']}"
    )  # code speculates
    assert rows["qa"][0][2 + gamma_max] == "off"

    # per task, the curve over the analysis' settings: each with its interval and the measured speedup, the
    # decision and the pool it routes to
    server_curves = _table(server_page, "curve-table")
    assert _option_headings(server_curves) == ["ngram-simple 3/8", "ngram-mod 16 2-16"]
    rows = _rows(server_curves, "data-task")
    assert sorted(rows) == sorted(t["task"] for t in server_data["tasks"])
    for t in server_data["tasks"]:
        (cells,) = rows[t["task"]]
        assert cells[2:4] == [_cell(o["speedup"], o["low"], o["high"]) for o in t["options"]]
        assert cells[4] == (t["chosen"] or "off")
    code = next(t for t in server_data["tasks"] if t["task"] == "code")
    assert code["chosen"] == "ngram-simple 3/8" and rows["code"][0][4] == "ngram-simple 3/8"
    assert rows["code"][0][6] == "llama-server-ngram-simple-3-8"  # its pool

    # per prompt, each option's predicted speedup and the best one, from the rows both kinds store alike
    for page, data in ((run_page, run_data), (server_page, server_data)):
        table = _table(page, "prompt-table")
        labels = _option_headings(table)[1:]  # after "best option"
        shown = [row for rows in _rows(table, "data-prompt-task").values() for row in rows]
        assert len(shown) == len(data["prompts"]) == 6
        by_number = {int(row[0]): row for row in shown}
        for number, prompt in enumerate(data["prompts"], start=1):
            row = by_number[prompt.get("position", number - 1) + 1]
            assert row[2] == prompt["task"] and row[4] == str(prompt["output_tokens"])
            options = prompt["options"]
            assert [o["label"] for o in options] == labels
            assert row[-len(labels) :] == [f"{o['predicted_speedup']:.2f}" for o in options]
            best = _best(options)
            assert row[-len(labels) - 2 : -len(labels)] == [best["label"], f"{best['predicted_speedup']:.2f}"]
            if "best_gamma" in prompt:  # a run's own g* is the best option
                assert best["label"] == f"gamma {prompt['best_gamma']}"

    # the exports every analysis has, then the kind's own
    for page, base in ((run_page, f"/runs/{run.id}"), (server_page, f"/llama-server/{record.id}")):
        exports = page[page.index('class="exports"') :].split("</p>")[0]
        assert f'href="{base}/report.json"' in exports and f'href="{base}/options.csv"' in exports
    assert (
        f'href="/runs/{run.id}/report.html"' in run_page and f'href="/runs/{run.id}/prompts.csv"' in run_page
    )
    # what stopped calibration, on the page and in the JSON
    said = _text(server_page.split('id="calibration-why">', 1)[1].split("</span>")[0])
    assert (
        said == f"Calibrated: {record.calibration_why}."
        and server_data["calibration"] == record.calibration_why
    )


def test_a_task_the_workload_decides_shows_no_interval_of_its_own(session, client):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2}, per_task=2)  # 2 prompts each: too few to decide
    session.commit()
    data = client.get(f"/runs/{run.id}/report.json").get_json()
    assert {t["decision_basis"] for t in data["tasks"].values()} == {"workload"}
    page = client.get(f"/runs/{run.id}").get_data(as_text=True)
    table = _table(page, "curve-table")
    gamma_max = data["params"]["gamma_max"]
    rows = _rows(table, "data-task")
    assert sorted(rows) == ["code", "qa"]
    for task, t in data["tasks"].items():
        (cells,) = rows[task]
        assert not any("[" in cell for cell in cells[2 : 2 + gamma_max]), (
            cells
        )  # g* and interval are the workload's
        assert cells[2 + gamma_max] == (f"gamma {t['best_gamma']}" if t["speculate"] else "off")
        assert "workload" in cells[3 + gamma_max]  # the rule says whose decision it is
    workload = data["workload"]
    total = re.search(r'<tr class="total">(.*?)</tr>', table, re.S).group(1)
    cells = [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", total, re.S)]
    assert cells[0] == "whole workload" and cells[1] == "4"
    assert cells[1 + workload["best_gamma"]] == _cell(
        workload["predicted_speedup"], *workload["speedup_interval"]
    )


def test_the_self_contained_export_shows_the_same_tables_without_links_or_script(session, client):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2}, per_task=3)
    session.commit()
    page = client.get(f"/runs/{run.id}").get_data(as_text=True)
    exported = client.get(f"/runs/{run.id}/report.html").get_data(as_text=True)
    assert _rows(_table(exported, "curve-table"), "data-task") == _rows(
        _table(page, "curve-table"), "data-task"
    )
    assert _rows(_table(exported, "prompt-table"), "data-prompt-task") == _rows(
        _table(page, "prompt-table"), "data-prompt-task"
    )
    assert 'id="routing-table"' in exported and 'class="plot speedup"' in exported
    assert "<a " not in _table(exported, "prompt-table") and 'id="prompt-filter"' not in exported
    assert 'id="prompt-filter"' in page and 'class="data sortable" id="prompt-table"' in page


def test_a_run_not_measured_yet_shows_its_progress_on_the_same_page(app, session, client):
    make_done_run(session, {"code": 0.9}, per_task=3, name="later")
    queued = create_run(session, "later", "hf:/models/target", "ngram", RunParams(gamma_max=4))
    session.commit()
    with templates_rendered(app) as names:
        page = client.get(f"/runs/{queued.id}").get_data(as_text=True)
    assert names == ["report.html"]
    assert 'id="run-status">queued<' in page and 'id="run-progress"' in page
    assert "No prompt has been measured yet; this page follows the progress." in page
    assert 'id="curve-table"' not in page and 'class="exports"' not in page
    header = _text(page[page.index('id="analysis-header"') :].split("</p>")[0])
    assert (
        "target hf:/models/target · draft ngram:max_ngram=2 · machine not yet known · prompt set later, 0 of 3 prompts"
        in header
    )


def test_a_run_page_names_the_prompts_the_run_left_out_and_why(session, client):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2}, per_task=3)
    why = "4313 tokens, where the context holds 4080 prompt tokens beside 16 new ones"
    run.left_out = {"prompts": [{"prompt_id": 99, "position": 7, "task": "qa", "tokens": 4313, "why": why}]}
    session.commit()
    page = client.get(f"/runs/{run.id}").get_data(as_text=True)
    section = page[page.index('id="run-left-out"') :].split("</section>")[0]
    assert f"<li>prompt 7 (qa): {why}</li>" in section
    assert "Left out: 1 prompt (below)" in page
    assert client.get(f"/runs/{run.id}/report.json").get_json()["left_out"] == run.left_out
