"""Rebuild the bundled sample workload (analyzer/sample_data/) from the shared labeled corpus.

Run ``python -m tests.sample_builder [CORPUS_DIR]`` to regenerate; tests/test_sample.py checks that
the shipped files are exactly what this produces, so the selection is reproducible and honest.

Selection: for each task type, prompts of at most MAX_CHARS characters when the task has enough of
them (otherwise the shortest), sources taken round-robin so each task mixes its datasets, then a
seeded shuffle within each source; PER_TASK prompts per task (all of them where the corpus has fewer).
The sample is shown in demos, so prompts unfit to show are left out: the ones a review named
(REVIEWED_OUT, with the reason) and any whose text has a word of UNFIT_WORDS.
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

PER_TASK = 5
MAX_CHARS = 2000
SEED = 20261125
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO_ROOT.parent / "shared" / "data" / "prompts"
SAMPLE_DIR = REPO_ROOT / "analyzer" / "sample_data"
# Reviewed by hand (every prompt of the sample read): left out, with the reason.
REVIEWED_OUT = {
    "arena-hard-v2:4da9823cd5ed480e": "asks for a sexually explicit story (German)",
}
UNFIT_WORDS = ("erotic", "erotisch", "sexual", "sexy", "porn", "nude", "nackt", "nsfw")


def fit_to_show(row: dict) -> bool:
    """Whether a corpus row may be in the demo sample (not reviewed out, no unfit word)."""
    text = row["prompt"].lower()
    return row["id"] not in REVIEWED_OUT and not any(word in text for word in UNFIT_WORDS)


def select_rows(rows: list[dict]) -> list[dict]:
    """The sample rows, grouped by task in sorted task order, in a deterministic order."""
    rng = random.Random(SEED)
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if fit_to_show(row):
            by_task[row["task"]].append(row)
    chosen: list[dict] = []
    for task in sorted(by_task):
        candidates = [r for r in by_task[task] if len(r["prompt"]) <= MAX_CHARS]
        if len(candidates) < PER_TASK:
            candidates = sorted(by_task[task], key=lambda r: (len(r["prompt"]), r["id"]))[:PER_TASK]
        by_source: dict[str, list[dict]] = defaultdict(list)
        for row in sorted(candidates, key=lambda r: r["id"]):
            by_source[row["source"].split(":")[0]].append(row)
        for group in by_source.values():
            rng.shuffle(group)
        picked: list[dict] = []
        while len(picked) < PER_TASK and any(by_source.values()):
            for source in sorted(by_source):
                if by_source[source] and len(picked) < PER_TASK:
                    picked.append(by_source[source].pop())
        chosen.extend(picked)
    return chosen


def license_rows(licenses_md: str, rows: list[dict]) -> list[str]:
    """The rows of the corpus license table whose source repository the sample uses."""
    repos = {row["source"].split(":")[0] for row in rows}
    kept = []
    for line in licenses_md.splitlines():
        if not line.startswith("| ") or line.startswith("| source") or line.startswith("|---"):
            continue
        cell = line.split("|")[1]
        if any(repo in cell or cell.strip().startswith(repo.split("/")[0] + " ") for repo in repos):
            kept.append(line)
    return kept


def build_sample(corpus_dir: Path = DEFAULT_CORPUS) -> tuple[str, str]:
    """The text of sample_prompts.jsonl and of LICENSES.md, built from ``corpus_dir``."""
    rows = [
        json.loads(line)
        for line in (corpus_dir / "dev.jsonl").read_text("utf-8").splitlines()
        if line.strip()
    ]
    chosen = select_rows(rows)
    jsonl = "".join(
        json.dumps({k: row[k] for k in ("id", "prompt", "task", "source", "license")}, ensure_ascii=False)
        + "\n"
        for row in chosen
    )
    table = license_rows((corpus_dir / "LICENSES.md").read_text("utf-8"), chosen)
    licenses = "\n".join(
        [
            "# Bundled sample prompts: sources and licenses",
            "",
            "`sample_prompts.jsonl` holds real public prompts, taken unchanged from the datasets below",
            "(selected by `tests/sample_builder.py` from specroute's labeled corpus). Each row keeps its",
            "`source` (repository and file) and `license`. Their original labels were mapped to",
            "specroute's task types as the last column says.",
            "",
            "| source | license | what was taken | mapping |",
            "|---|---|---|---|",
            *table,
            "",
        ]
    )
    return jsonl, licenses


def main() -> None:
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CORPUS
    jsonl, licenses = build_sample(corpus)
    (SAMPLE_DIR / "sample_prompts.jsonl").write_text(jsonl, "utf-8")
    (SAMPLE_DIR / "LICENSES.md").write_text(licenses, "utf-8")
    print(f"wrote {jsonl.count(chr(10))} prompts to {SAMPLE_DIR}")


if __name__ == "__main__":
    main()
