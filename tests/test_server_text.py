"""A stored llama-server analysis in words: exactly what its validation guarantees where speculation changed
the served output."""

from __future__ import annotations

from analyzer.analysis.server_text import decision_text, divergence_text


def _row(runs: int, output_equal: float, mare: float, advice_mare: float, aggregate_error: float) -> dict:
    return {
        "runs": runs,
        "output_equal": output_equal,
        "mare": mare,
        "advice_mare": advice_mare,
        "aggregate_error": aggregate_error,
    }


def test_where_speculation_changed_outputs_the_advice_is_held_to_its_aggregate_and_says_by_how_much():
    text = divergence_text([_row(12, 0.5, 0.02, 0.08, 0.02), _row(4, 0.25, 0.031, 0.092, 0.032)])
    # runs weighted: (12 * 0.5 + 4 * 0.75) / 16 = 56%
    assert text.startswith("Speculation changed the served output in 56% of 16 validated prompt-settings")
    assert "is held to its aggregate per setting (error 2.0%-3.2% here), not to each prompt" in text
    assert text.endswith(
        "(error per prompt 8.0%-9.2% for the advice, 2.0%-3.1% for the cost model on the work served)."
    )


def test_where_every_output_equals_plain_greedy_the_advice_is_the_price_of_the_exact_replay():
    text = divergence_text([_row(10, 1.0, 0.021, 0.021, 0.01), _row(10, 1.0, 0.021, 0.021, 0.004)])
    assert text == (
        "Every validated speculating server served plain greedy's output (20 prompt-settings): the advice is "
        "the price of the exact replay of the work those servers did (error per prompt 2.1%)."
    )


def test_an_analysis_without_validation_says_it_does_not_know():
    unvalidated = "Not validated: what speculation does to this workload's output is not known."
    assert divergence_text(None) == unvalidated
    assert divergence_text([{"runs": 0, "output_equal": None}]) == unvalidated


def test_a_decision_says_how_much_of_its_interval_is_the_fits_own_spread():
    curve = {
        "options": [
            {"label": "ngram-simple 2/4", "speedup": 1.086, "low": 0.665, "high": 1.507},
            {"label": "ngram-mod 16 8-32", "speedup": 1.0, "low": 1.0, "high": 1.0},
        ],
        "chosen": None,
        "code": "interval_reaches_loss",
        "basis": "task",
        "fit_errors": [0.254, 0.0],
    }
    assert decision_text({"chosen": None, "curve": curve}) == (
        "off: ngram-simple 2/4 1.09 [0.67, 1.51] (the fit's own spread ±0.25 in it), interval reaches loss"
    )
    # no spread (a fit on too few prompts to leave one out, or an analysis stored before the fits were kept)
    assert decision_text({"chosen": None, "curve": {**curve, "fit_errors": []}}) == (
        "off: ngram-simple 2/4 1.09 [0.67, 1.51], interval reaches loss"
    )
