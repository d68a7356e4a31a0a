"""Cost profiles from an engine's own benchmark: a JSON or CSV file checked line by
line (nothing stored when any line is bad, a physically implausible profile refused), stored for a
run's pair, and a finished run re-priced with it, without measuring again, in the CLI and the web UI:
another gamma and another decision from the same stored acceptance. Times out of
range (seconds typed as milliseconds), duplicates and pairs no run knows are refused, the last unless
the import is told it is a new pair."""

from __future__ import annotations

import html
import io
import json
import re

import pytest

from analyzer.analysis.cost_import import CostFileError
from analyzer.analysis.cost_import_parse import parse_cost_file
from tests.test_runs import PROMPTS, _analyze, cli_db, model_folders  # noqa: F401 (fixtures)
from webui.cli import cli

VLLM = {"engine": "vllm", "engine_version": "0.11.0", "device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16"}
# verifying more tokens costs nothing more and drafting is free: speculate as far as the run looked
CHEAP = {**VLLM, "target_step_ms": [4.0] * 5, "draft_step_ms": 0.0}
# a whole round at num_speculative_tokens = 1..4 costs 3-9 plain steps: never speculate
DEAR = {**VLLM, "plain_step_ms": 4.0, "round_ms": [12.0, 18.0, 26.0, 36.0]}
# eager transformers on a CPU: verifying k tokens costs k plain steps and a draft step costs as much as a
# target step (tiny models), so a round drafting g tokens costs 4 g + 2 ms for at most g + 1 tokens
# where plain decoding takes 2 ms a token: speculation loses at every gamma whatever the acceptance,
# and S(1) beats every longer gamma (the 1 + g a_1 tokens bound); priced so, not measured on a busy CPU
STEEP = {
    "engine": "transformers",
    "device": "cpu",
    "dtype": "float32",
    "target_step_ms": [2.0, 4.0, 6.0, 8.0, 10.0],
    "draft_step_ms": 2.0,
}
SECONDS_HINT = (
    "shorter than any engine's decoding step: were the times in seconds? the fields are in milliseconds"
)
MINUTE_HINT = (
    "a minute for one step: were the times in microseconds, or of a whole generation? the fields are in "
    "milliseconds"
)
SAME = "(the same engine, engine_version, device, dtype, batch_size, target, draft and times)"


def _unknown(line: int, field: str, spec: str) -> str:
    return (
        f"line {line}, field '{field}': no stored run or model spec knows {spec}; check the spelling, or import "
        "with --new-pair (on the web page: tick 'new pair') to store a profile for a pair not analysed yet"
    )


def _problems(text: str, name: str) -> list[str]:
    with pytest.raises(CostFileError) as caught:
        parse_cost_file(text.encode(), name)
    return caught.value.problems


def test_a_bad_json_file_names_each_problem_with_its_line_and_field():
    text = json.dumps(
        [
            {"engine": "vllm", "dtype": "bfloat16", "target_step_ms": [4.0, 4.1], "draft_step_ms": -1},
            {**VLLM, "target_step_ms": [4.0, 2.0, 4.4], "draft_step_ms": 0.1, "batch": 4},
            {**VLLM, "plain_step_ms": 4.0, "round_ms": [5.0, "fast"]},
        ],
        indent=1,
    )
    problems = _problems(text, "vllm.json")
    assert problems == [
        "line 2, field 'device': required",
        "line 9, field 'draft_step_ms': must be at least 0, got -1",
        "line 22, field 'batch': unknown field (known: batch_size, decode_overhead_ms, device, draft, "
        "draft_step_ms, dtype, engine, engine_version, plain_step_ms, round_ms, round_overhead_ms, target, "
        "target_step_ms)",
        "line 16, field 'target_step_ms': physically implausible T_t(k)/T_t(1) = 0.50 at k = 2 (a pass over k "
        "tokens takes 0.9 to 1.5 k times a pass over one); were the times warm and in milliseconds?",
        "line 30, field 'round_ms[2]': expected a number, got 'fast'",
    ]
    assert _problems('{"engine": "vllm",\n "device": \n}', "x.json") == [
        "line 3: bad JSON: Expecting value at column 1"
    ]


def test_each_key_is_named_at_its_own_line_however_many_keys_and_however_written():
    """The line of a field is where its key stands as a key: not where the same text stands as a value, a key
    written with escapes found as well, and a file of many keys read in one pass (not one search of the file
    per key)."""
    text = (
        '[{"engine": "vllm",\n "device": "\\"dtype\\":",\n "dtype": "bfloat16",\n'
        ' "target_step_ms": [4.0, 4.1],\n "draft_step_ms": 0,\n "b\\u0061tch": 1}]'
    )
    assert json.loads(text)[0]["batch"] == 1
    problems = _problems(text, "escaped.json")
    assert [p for p in problems if "'batch'" in p][0].startswith("line 6, field 'batch': unknown field")
    many = {**VLLM, "target_step_ms": [4.0, 4.1], "draft_step_ms": 0} | {f"k{i}": i for i in range(20_000)}
    with pytest.raises(CostFileError, match="20000 problems; nothing was imported") as caught:
        parse_cost_file(json.dumps([many], indent=0).encode(), "many.json")  # "[", "{", 10 lines, then k0
    listed = [re.match(r"line (\d+), field 'k(\d+)': unknown field", p) for p in caught.value.problems]
    assert len(listed) == 50 and all(m is not None and int(m[1]) == int(m[2]) + 12 for m in listed)


def test_a_bad_csv_file_names_each_problem_with_its_line_and_field():
    text = (
        "engine,device,dtype,batch_size,draft_step_ms,t1_ms,t2_ms,t3_ms\n"
        "vllm,H100,bfloat16,1,0.1,4.0,4.1,4.2\n"
        "vllm,H100,bfloat16,two,0.1,4.0,,4.2\n"
        "sglang,H100,bfloat16,4,0.1,4.0,30.0,4.2\n"
    )
    assert _problems(text, "steps.csv") == [
        "line 3, field 'target_step_ms': t<k>_ms cells must run from k = 1 without gaps",
        "line 3, field 'batch_size': expected a number, got 'two'",
        "line 4, field 'target_step_ms': physically implausible T_t(k)/T_t(1) = 7.50 at k = 2 (a pass over k "
        "tokens takes 0.9 to 1.5 k times a pass over one); were the times warm and in milliseconds?",
    ]
    good = parse_cost_file(
        text.splitlines(keepends=True)[0].encode() + text.splitlines(keepends=True)[1].encode(), "a.csv"
    )
    assert len(good) == 1 and good[0].target_forward_s == pytest.approx([0.004, 0.0041, 0.0042])
    assert good[0].draft_step_s == pytest.approx(0.0001) and good[0].shape == "forwards"


def test_a_rounds_profile_is_stored_as_plain_step_then_one_round_per_lookahead():
    (profile,) = parse_cost_file(json.dumps(DEAR).encode(), "dear.json")
    assert profile.target_forward_s == pytest.approx([0.004, 0.012, 0.018, 0.026, 0.036])
    assert profile.draft_step_s == 0.0 and profile.shape == "rounds" and profile.batch_size == 1


def _one_per_line(*profiles: dict) -> str:
    """A JSON list with profile i on line i + 1."""
    return "[\n" + ",\n".join(json.dumps(p) for p in profiles) + "\n]"


def test_times_out_of_range_are_refused_with_their_line_field_and_a_hint():
    text = _one_per_line(
        {**VLLM, "plain_step_ms": 0.0061, "round_ms": [0.0066, 6.8, 0.007]},  # seconds, the user report
        {**VLLM, "target_step_ms": [4.0, 0.05], "draft_step_ms": 0.0},
        {**VLLM, "target_step_ms": [61000.0, 62000.0], "draft_step_ms": 70000, "round_overhead_ms": 1e9},
        {**CHEAP, "batch_size": 4096, "target": "ngram", "draft": "ngram"},
    )
    assert _problems(text, "seconds.json") == [
        f"line 2, field 'plain_step_ms': 0.0061 ms is under 0.1 ms, {SECONDS_HINT}",
        f"line 2, field 'round_ms[1]': 0.0066 ms is under 0.1 ms, {SECONDS_HINT}",  # a list's first only
        f"line 3, field 'target_step_ms[2]': 0.05 ms is under 0.1 ms, {SECONDS_HINT}",
        f"line 4, field 'draft_step_ms': 70000 ms is over 60000 ms, {MINUTE_HINT}",
        f"line 4, field 'round_overhead_ms': 1e+09 ms is over 60000 ms, {MINUTE_HINT}",
        f"line 4, field 'target_step_ms[1]': 61000 ms is over 60000 ms, {MINUTE_HINT}",
        "line 5, field 'batch_size': at most 1024 sequences decoded together, got 4096; the batch size "
        "counts sequences, not tokens",
        "line 5, field 'target': the target must be a model, not 'ngram' (n-gram lookup drafts, it does not "
        "verify)",
    ]
    # a field on its own line is named there
    assert _problems(json.dumps({**DEAR, "plain_step_ms": 0.004}, indent=1), "s.json") == [
        f"line 6, field 'plain_step_ms': 0.004 ms is under 0.1 ms, {SECONDS_HINT}"
    ]
    # the edges are allowed, and a draft step of 0 (an n-gram lookup) too
    edges = {**VLLM, "target_step_ms": [0.1, 0.1], "draft_step_ms": 0.0, "decode_overhead_ms": 60000}
    (profile,) = parse_cost_file(json.dumps(edges).encode(), "edges.json")
    assert profile.target_forward_s == pytest.approx([0.0001, 0.0001]) and profile.draft_step_s == 0.0
    rounds = {**VLLM, "plain_step_ms": 6.1, "round_ms": [6.6, 60000.0]}
    assert _problems(json.dumps(rounds), "r.json")[0].startswith("line 1, field 'round_ms': physically")
    csv_seconds = "engine,device,dtype,plain_step_ms,round1_ms\nvllm,H100,bf16,0.0061,0.0066\n"
    assert _problems(csv_seconds, "s.csv") == [
        f"line 2, field 'plain_step_ms': 0.0061 ms is under 0.1 ms, {SECONDS_HINT}",
        f"line 2, field 'round_ms[1]': 0.0066 ms is under 0.1 ms, {SECONDS_HINT}",
    ]


def test_a_profile_given_twice_in_one_file_is_refused():
    # 4 and 4.0 ms are the same time; another batch size, draft step or pair is another profile
    named = {**DEAR, "target": "hf:org/model", "draft": "ngram"}
    rows = [CHEAP, DEAR, {**CHEAP, "target_step_ms": [4, 4, 4, 4, 4]}, named, {**DEAR, "batch_size": 4}]
    rows += [{**CHEAP, "draft_step_ms": 0.5}, named]
    assert _problems(_one_per_line(*rows), "twice.json") == [
        f"line 4: the same profile as line 2 {SAME}",
        f"line 8: the same profile as line 5 {SAME}",
    ]
    assert (
        len(parse_cost_file(("[" + ",".join(json.dumps(r) for r in rows[3:6]) + "]").encode(), "ok.json"))
        == 3
    )


def test_an_import_refuses_a_pair_no_run_knows_unless_told_and_a_profile_already_stored(cli_db, tmp_path):
    def run(*args):
        result = cli_db.invoke(cli, ["costs", "import", *map(str, args)])
        return result.exit_code, result.stderr.splitlines()

    def stored():
        return [p["id"] for p in json.loads(cli_db.invoke(cli, ["costs", "list", "--json"]).stdout)]

    typo = {**DEAR, "target": "hf:nonexistent/model", "draft": "ngram"}
    file = tmp_path / "typo.json"
    file.write_text(json.dumps([typo], indent=1))
    assert run(file) == (
        1,
        [
            "typo.json: 2 problems; nothing was imported",
            "  " + _unknown(14, "target", "hf:nonexistent/model"),  # the lines of the fields
            "  " + _unknown(15, "draft", "ngram:max_ngram=2"),
        ],
    )
    assert stored() == []
    assert run(file, "--new-pair")[0] == 0 and stored() == [1]
    # stored again, alone or beside a new profile: nothing of the file is stored
    assert run(file, "--new-pair") == (
        1,
        ["typo.json: 1 problem; nothing was imported", f"  line 2: already stored as cost profile #1 {SAME}"],
    )
    both = tmp_path / "both.json"
    both.write_text(json.dumps([{**typo, "batch_size": 4}, typo]))
    assert run(both) == (
        1,
        ["both.json: 1 problem; nothing was imported", f"  line 1: already stored as cost profile #1 {SAME}"],
    )
    assert stored() == [1]
    # the pair is known now (the flagged import stored it): another profile of it needs no flag, another
    # version of the engine is not the same profile; a draft no one knows still is refused
    other = tmp_path / "other.json"
    other.write_text(
        _one_per_line(
            {**typo, "batch_size": 4},
            {**typo, "engine_version": "0.12.0"},
            {**typo, "draft": "hf:nonexistent/drafter"},
        )
    )
    assert run(other) == (
        1,
        [
            "other.json: 1 problem; nothing was imported",
            "  " + _unknown(4, "draft", "hf:nonexistent/drafter"),
        ],
    )
    other.write_text(json.dumps([{**typo, "batch_size": 4}, {**typo, "engine_version": "0.12.0"}]))
    assert run(other)[0] == 0 and stored() == [3, 2, 1]
    # a queued run's pair is known: the specs of every stored run are
    queued = cli_db.invoke(
        cli,
        [
            "analyze",
            "--prompts",
            "mix",
            "--target",
            "hf:org/served",
            "--draft",
            "ngram:max_ngram=3",
            "--queue",
        ],
    )
    assert queued.exit_code == 0, queued.stderr
    served = tmp_path / "served.json"
    served.write_text(json.dumps([{**CHEAP, "target": "hf:org/served", "draft": "ngram:max_ngram=3"}]))
    assert run(served)[0] == 0 and stored() == [4, 3, 2, 1]
    # a row naming the run's pair and one taking it from --for-run, and the run's profile again
    run_pair = tmp_path / "run_pair.json"
    run_pair.write_text(
        _one_per_line(DEAR, {**DEAR, "target": "hf:org/served", "draft": "ngram:max_ngram=3"}, CHEAP)
    )
    assert run(run_pair, "--for-run", 1) == (
        1,
        [
            "run_pair.json: 2 problems; nothing was imported",
            f"  line 3: the same profile as line 2 {SAME}",
            f"  line 4: already stored as cost profile #4 {SAME}",
        ],
    )
    assert stored() == [4, 3, 2, 1]
    run_pair.write_text(_one_per_line(DEAR))
    assert run(run_pair, "--for-run", 1)[0] == 0 and stored() == [5, 4, 3, 2, 1]


@pytest.mark.slow
def test_an_imported_profile_reprices_a_finished_run_with_another_gamma_and_decision(
    cli_db, model_folders, tmp_path
):
    # the first run is priced with a CPU-like profile, not the cost this CPU measures under load
    pair = {"target": f"hf:{model_folders['target']}", "draft": f"hf:{model_folders['draft']}"}
    steep = tmp_path / "steep.json"
    steep.write_text(json.dumps({**STEEP, **pair}))
    refused = cli_db.invoke(cli, ["costs", "import", str(steep)])
    assert refused.exit_code == 1 and "no stored run or model spec knows hf:" in refused.stderr
    assert cli_db.invoke(cli, ["costs", "import", str(steep), "--new-pair"]).exit_code == 0
    first = _analyze(cli_db, "--target", pair["target"], "--draft", pair["draft"], "--cost-profile", "1")
    assert first.exit_code == 0, first.stderr
    measured = json.loads(first.stdout)
    assert measured["engine"] == "transformers" and not measured["workload"]["speculate"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([CHEAP, {**DEAR, "round_ms": [12.0, -3.0]}]))
    refused = cli_db.invoke(cli, ["costs", "import", str(bad), "--for-run", "1"])
    assert refused.exit_code == 1 and "bad.json: 1 problem; nothing was imported" in refused.stderr
    assert "line 1, field 'round_ms[2]': must be above 0, got -3.0" in refused.stderr
    assert len(json.loads(cli_db.invoke(cli, ["costs", "list", "--json"]).stdout)) == 1  # the run's own only
    again = cli_db.invoke(cli, ["costs", "import", str(steep)])  # known now (the run's), and stored
    assert again.exit_code == 1 and f"line 1: already stored as cost profile #1 {SAME}" in again.stderr
    costs = tmp_path / "vllm.json"
    costs.write_text(json.dumps({"profiles": [CHEAP, DEAR]}, indent=1))
    imported = json.loads(
        cli_db.invoke(cli, ["costs", "import", str(costs), "--for-run", "1", "--json"]).stdout
    )
    assert [(p["id"], p["source"], p["engine"], p["k_max"]) for p in imported] == [
        (2, "imported", "vllm", 5),
        (3, "imported", "vllm", 5),
    ]
    cheap = cli_db.invoke(cli, ["reprice", "1", "--cost-profile", "2"])
    assert cheap.exit_code == 0, cheap.stderr
    assert "run 2: run 1's acceptance priced with cost profile 2" in cheap.stdout
    # priced with CPU-like steps speculation loses; priced with the engine's flat steps it pays, further
    # ahead: another g* and another decision from the same acceptance
    changed = re.search(r"\(workload\)\s+g(\d) \d\.\d\dx off\s+g(\d) \d\.\d\dx on\n", cheap.stdout)
    assert changed and int(changed.group(2)) > int(changed.group(1)), cheap.stdout
    dear = cli_db.invoke(cli, ["reprice", "1", "--cost-profile", "3", "--publish"])
    assert dear.exit_code == 0 and "published policy set v1 from run 3 (active)" in dear.stdout
    on, off = (json.loads(cli_db.invoke(cli, ["report", str(r), "--format", "json"]).stdout) for r in (2, 3))
    assert on["engine"] == off["engine"] == "vllm" and on["measured_in"] == "transformers"
    assert (
        on["repriced_from"] == off["repriced_from"] == 1 and on["cost_profiles"]["1"]["source"] == "imported"
    )
    assert on["workload"]["speculate"] and on["workload"]["best_gamma"] == int(changed.group(2))
    assert not off["workload"]["speculate"] and off["workload"]["predicted_speedup"] < 1.0
    assert off["workload"]["best_gamma"] < on["workload"]["best_gamma"]
    for priced in (on, off):  # the acceptance is the stored one: nothing was measured again
        assert {t: s["alpha_mean"] for t, s in priced["tasks"].items()} == {
            t: s["alpha_mean"] for t, s in measured["tasks"].items()
        }
        assert priced["validation"] == [] and len(priced["prompts"]) == len(measured["prompts"])
    text = cli_db.invoke(cli, ["report", "2"]).stdout
    assert "imported from vllm 0.11.0's own benchmark, not judged here" in text
    # a new analysis priced with the imported profile measures no cost of its own
    priced_new = _analyze(
        cli_db,
        "--target",
        f"hf:{model_folders['target']}",
        "--draft",
        f"hf:{model_folders['draft']}",
        "--cost-profile",
        "2",
    )
    assert priced_new.exit_code == 0, priced_new.stderr
    assert "profiling the cost" not in priced_new.stderr
    new = json.loads(priced_new.stdout)
    assert new["engine"] == "vllm" and new["cost_profile"]["id"] == 2
    assert new["workload"]["best_gamma"] == on["workload"]["best_gamma"] and new["workload"]["speculate"]
    too_far = _analyze(
        cli_db,
        *("--target", f"hf:{model_folders['target']}", "--draft", f"hf:{model_folders['draft']}"),
        *("--gamma-max", "8", "--cost-profile", "2"),
    )
    assert too_far.exit_code == 1 and "use --gamma-max 4 or less" in too_far.stderr
    assert len(json.loads(cli_db.invoke(cli, ["runs", "list", "--json"]).stdout)) == 4  # nothing stored
    missing = cli_db.invoke(cli, ["reprice", "1", "--cost-profile", "99"])
    assert missing.exit_code == 1 and "no cost profile 99" in missing.stderr
    other = _analyze(cli_db, "--target", f"hf:{model_folders['target']}", "--draft", "ngram")
    other_id = json.loads(other.stdout)["run_id"]
    wrong_pair = cli_db.invoke(cli, ["reprice", str(other_id), "--cost-profile", "2"])
    assert wrong_pair.exit_code == 1 and "not this run's pair" in wrong_pair.stderr


def test_the_report_page_prices_the_run_on_every_profile_and_reprices_in_a_click(
    cli_db, model_folders, tmp_path
):
    from analyzer.settings import load_settings
    from webui.app import create_app

    result = _analyze(
        cli_db, "--target", f"hf:{model_folders['target']}", "--draft", f"hf:{model_folders['draft']}"
    )
    assert result.exit_code == 0, result.stderr
    app = create_app(
        {"database_url": load_settings().resolved_database_url(), "ui_worker": False, "TESTING": True}
    )
    try:
        web = app.test_client()
        token = re.search(
            r'name="csrf_token" value="([^"]+)"', web.get("/costs").get_data(as_text=True)
        ).group(1)
        bad = web.post(
            "/costs",
            data={
                "csrf_token": token,
                "for_run": "1",
                "file": (io.BytesIO(b"engine,device,dtype,t1_ms,t2_ms\nvllm,H100,bf16,4.0\n"), "bad.csv"),
            },
            content_type="multipart/form-data",
        )
        assert bad.status_code == 400
        assert "line 2: 4 cells for 5 columns" in bad.get_data(as_text=True)
        good = web.post(
            "/costs",
            data={
                "csrf_token": token,
                "for_run": "1",
                "file": (io.BytesIO(json.dumps([CHEAP, DEAR]).encode()), "vllm.json"),
            },
            content_type="multipart/form-data",
        )
        assert good.status_code == 302 and good.headers["Location"].endswith("/runs/1")
        page = web.get("/runs/1").get_data(as_text=True)
        table = page.split('id="comparison-table"')[1].split("</table>")[0]
        rows = re.findall(r"<tr[^>]*><td class=\"num\">#(\d+)", table)
        assert rows == ["1", "3", "2"] and "(this run's)" in table and "Re-price with #2" in table
        assert table.count(">speculate<") >= 1 and table.count(">off<") >= 1  # the two imported differ
        priced = web.post("/runs/1/reprice", data={"csrf_token": token, "profile_id": "2"})
        assert priced.status_code == 302 and priced.headers["Location"].endswith("/runs/2")
        report = web.get("/runs/2").get_data(as_text=True)
        assert 'id="repriced-from"' in report and "priced with cost profile #2 (imported, vllm" in report
        assert web.post("/runs/1/reprice", data={"csrf_token": token, "profile_id": "77"}).status_code == 302
        assert "no cost profile 77" in web.get("/runs/1").get_data(as_text=True)
        listed = web.get("/costs").get_data(as_text=True)
        assert listed.count("<td>imported</td>") == 2 and "vllm 0.11.0" in listed

        def post(name: str, profiles: list[dict], **form: str):
            upload = (io.BytesIO(json.dumps(profiles).encode()), name)
            data = {"csrf_token": token, "file": upload, **form}
            return web.post("/costs", data=data, content_type="multipart/form-data")

        again = post("vllm.json", [CHEAP, DEAR], for_run="1")
        assert again.status_code == 400
        assert f"line 1: already stored as cost profile #2 {SAME}" in html.unescape(
            again.get_data(as_text=True)
        )
        typo = [{**DEAR, "target": "hf:nonexistent/model", "draft": f"hf:{model_folders['draft']}"}]
        unknown = post("typo.json", typo)
        page = html.unescape(unknown.get_data(as_text=True))
        assert unknown.status_code == 400 and _unknown(1, "target", "hf:nonexistent/model") in page
        assert "field 'draft'" not in page and 'id="new-pair">' in page  # the run's draft is known
        kept = post("typo.json", [{**typo[0], "batch_size": 0}], new_pair="1")
        assert kept.status_code == 400 and 'id="new-pair" checked>' in kept.get_data(as_text=True)
        assert post("typo.json", typo, new_pair="1").status_code == 302
        assert web.get("/costs").get_data(as_text=True).count("<td>imported</td>") == 3
    finally:
        app.extensions["specroute.close"]()


def test_a_runs_price_comparison_is_computed_once_per_profile_and_dropped_with_its_summary(
    cli_db, model_folders, tmp_path, monkeypatch
):
    from analyzer.advice import summary
    from analyzer.advice.summary_store import store_summary
    from analyzer.analysis.repricing import price_comparison
    from analyzer.db import make_engine, make_session_factory
    from analyzer.orm import AnalysisRun
    from analyzer.settings import load_settings

    result = _analyze(
        cli_db, "--target", f"hf:{model_folders['target']}", "--draft", f"hf:{model_folders['draft']}"
    )
    assert result.exit_code == 0, result.stderr
    costs = tmp_path / "vllm.json"
    costs.write_text(json.dumps([CHEAP, DEAR]))
    assert cli_db.invoke(cli, ["costs", "import", str(costs), "--for-run", "1"]).exit_code == 0
    sessions = make_session_factory(make_engine(load_settings().resolved_database_url()))
    with sessions() as session, session.begin():
        first = price_comparison(session, session.get(AnalysisRun, 1))
    with sessions() as session, session.begin():
        run = session.get(AnalysisRun, 1)
        assert sorted(run.price_comparisons) == ["2", "3"]  # the imported ones; the run's own is its summary
        with monkeypatch.context() as patched:  # a second view prices nothing
            patched.setattr(summary, "summarize_groups", lambda *a, **k: pytest.fail("priced again"))
            assert price_comparison(session, run) == first
        assert [row["profile_id"] for row in first] == [1, 3, 2]
        assert first[2]["workload"]["speculate"] and not first[1]["workload"]["speculate"]
        run.summary = None
        store_summary(session, run)  # computed anew: the comparisons priced from the old one go with it
        assert run.price_comparisons is None
        assert price_comparison(session, run) == first
