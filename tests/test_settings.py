"""Settings: defaults, then SPECROUTE_* environment, then explicit overrides; bad values named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.settings import (
    Settings,
    SettingsError,
    api_token_scope,
    describe_settings,
    load_settings,
    router_min_confidence,
)


def test_defaults_environment_then_overrides(tmp_path):
    defaults = load_settings(environ={})
    assert defaults.max_prompts == 50_000 and defaults.sqlite_busy_timeout_ms == 5000
    assert defaults.resolved_database_url().endswith("/specroute.db")
    env = {"SPECROUTE_DATA_DIR": str(tmp_path), "SPECROUTE_MAX_PROMPTS": "10"}
    from_env = load_settings(environ=env)
    assert from_env.resolved_database_url() == f"sqlite:///{tmp_path / 'specroute.db'}"
    assert from_env.max_prompts == 10
    overridden = load_settings({"max_prompts": 3, "SPECROUTE_DATABASE_URL": "sqlite:///x.db"}, environ=env)
    assert (overridden.max_prompts, overridden.resolved_database_url()) == (3, "sqlite:///x.db")


def test_bad_values_and_unknown_names_are_errors_naming_the_setting():
    with pytest.raises(SettingsError, match="SPECROUTE_MAX_PROMPTS: expected an integer, got 'many'"):
        load_settings(environ={"SPECROUTE_MAX_PROMPTS": "many"})
    with pytest.raises(SettingsError, match="SPECROUTE_MAX_UPLOAD_BYTES: must be positive"):
        load_settings(environ={"SPECROUTE_MAX_UPLOAD_BYTES": "0"})
    with pytest.raises(SettingsError, match="unknown setting 'max_prompt'"):
        load_settings({"max_prompt": 1}, environ={})
    with pytest.raises(SettingsError, match="SPECROUTE_STALE_AFTER_S: must be at least 1 seconds, got 0.5"):
        load_settings(environ={"SPECROUTE_STALE_AFTER_S": "0.5"})
    assert load_settings(environ={"SPECROUTE_STALE_AFTER_S": "1"}).stale_after_s == 1.0


def test_a_value_of_the_wrong_type_in_the_environment_names_the_variable_and_what_it_accepts():
    with pytest.raises(SettingsError) as caught:
        load_settings(environ={"SPECROUTE_ROUTER_REFRESH_S": "soon"})
    assert str(caught.value) == "SPECROUTE_ROUTER_REFRESH_S: expected a number, got 'soon'"
    assert (caught.value.code, caught.value.status) == ("invalid_setting", 500)
    assert caught.value.details == {"settings": ["SPECROUTE_ROUTER_REFRESH_S"]}
    with pytest.raises(SettingsError) as caught:
        load_settings(environ={"SPECROUTE_UI_WORKER": "maybe", "SPECROUTE_MAX_PROMPTS": "2.5"})
    assert str(caught.value) == (  # every refused value at once, in the order the settings are declared
        "SPECROUTE_MAX_PROMPTS: expected an integer, got '2.5'; "
        "SPECROUTE_UI_WORKER: expected true or false (1/0, yes/no, on/off), got 'maybe'"
    )
    assert caught.value.details == {"settings": ["SPECROUTE_MAX_PROMPTS", "SPECROUTE_UI_WORKER"]}
    with pytest.raises(SettingsError, match=r"^SPECROUTE_QUIET_WAIT_S: expected a finite number, got 'nan'$"):
        load_settings(environ={"SPECROUTE_QUIET_WAIT_S": "nan"})
    with pytest.raises(SettingsError, match=r"^SPECROUTE_QUIET_WAIT_S: must be at least 0, got '-1'$"):
        load_settings(environ={"SPECROUTE_QUIET_WAIT_S": "-1"})
    with pytest.raises(SettingsError, match=r"^SPECROUTE_MAX_PROMPTS: expected an integer, got 'True'$"):
        load_settings({"max_prompts": True}, environ={})  # not read as 1


def test_the_explicit_mapping_refuses_unknown_keys_and_the_environment_ignores_unknown_variables():
    with pytest.raises(SettingsError, match=r"^unknown setting 'SPECROUTE_MAX_PROMPT'; known: data_dir, "):
        load_settings({"SPECROUTE_MAX_PROMPT": 1}, environ={})
    with pytest.raises(SettingsError, match="unknown setting 'TESTING'"):
        load_settings({"TESTING": True}, environ={})
    settings = load_settings({"Max_Prompts": "7"}, environ={"SPECROUTE_MAX_PROMPT": "oops"})
    assert settings.max_prompts == 7


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("1", True), ("true", True), ("TRUE", True), ("yes", True), (" On ", True), (True, True), (1, True),
        ("0", False), ("false", False), ("No", False), ("off", False), ("", False), (False, False), (0, False),
    ],
)  # fmt: skip
def test_flags_accept_the_spellings_they_always_accepted(spelling, expected):
    assert load_settings({"allow_downloads": spelling}, environ={}).allow_downloads is expected
    if isinstance(spelling, str):
        assert load_settings(environ={"SPECROUTE_UI_WORKER": spelling}).ui_worker is expected


@pytest.mark.parametrize("spelling", ["t", "y", "2", "enabled"])
def test_flags_refuse_other_spellings(spelling):
    with pytest.raises(
        SettingsError, match=rf"^SPECROUTE_SUGGEST_TASKS: expected true or false .*got '{spelling}'$"
    ):
        load_settings(environ={"SPECROUTE_SUGGEST_TASKS": spelling})


def test_every_setting_has_a_type_a_default_and_a_description_from_the_model():
    described = describe_settings()
    assert [row["name"] for row in described] == list(Settings.model_fields)
    assert len(described) == 30
    for row in described:
        assert row["env"] == "SPECROUTE_" + row["name"].upper()
        assert row["type"] in {"str", "int", "float", "bool"}, row
        assert isinstance(row["help"], str) and len(row["help"].strip()) >= 20, row["name"]
        assert row["help"] == Settings.model_fields[row["name"]].description
    by_name = {row["name"]: row for row in described}
    assert (by_name["max_prompts"]["type"], by_name["max_prompts"]["default"]) == ("int", 50_000)
    assert (by_name["ui_worker"]["type"], by_name["ui_worker"]["default"]) == ("bool", True)
    assert (by_name["stale_after_s"]["type"], by_name["stale_after_s"]["default"]) == ("float", 600.0)
    assert load_settings(environ={}) == Settings()  # every default passes the model's own checks


def test_counts_and_seconds_have_their_lower_bounds():
    assert load_settings({"classifier_jobs": 0}, environ={}).classifier_jobs == 0  # 0: one per CPU core
    assert load_settings(environ={"SPECROUTE_CLASSIFIER_JOBS": "3"}).classifier_jobs == 3
    with pytest.raises(SettingsError, match=r"^SPECROUTE_CLASSIFIER_JOBS: must be at least 0, got '-1'$"):
        load_settings(environ={"SPECROUTE_CLASSIFIER_JOBS": "-1"})
    with pytest.raises(SettingsError, match=r"^SPECROUTE_ROUTER_MAX_BATCH_SIZE: must be positive, got '0'$"):
        load_settings({"router_max_batch_size": 0}, environ={})
    assert load_settings(environ={"SPECROUTE_ROUTER_REFRESH_S": "0"}).router_refresh_s == 0.0
    with pytest.raises(SettingsError, match=r"^SPECROUTE_STALE_AFTER_S: must be at least 1 seconds, got -5 "):
        load_settings({"stale_after_s": -5}, environ={})
    with pytest.raises(
        SettingsError, match=r"^SPECROUTE_STALE_AFTER_S: expected a finite number, got 'inf'$"
    ):
        load_settings(environ={"SPECROUTE_STALE_AFTER_S": "inf"})


@given(st.integers(min_value=1, max_value=10**12), st.sampled_from(["", " ", "+"]))
def test_a_positive_count_reads_back_from_its_text(count, pad):
    assert load_settings(environ={"SPECROUTE_MAX_PROMPTS": f"{pad}{count}"}).max_prompts == count


def test_choices_are_checked_and_normalised_when_the_settings_are_read(tmp_path):
    settings = load_settings(
        {"api_token_scope": "writes, route", "router_min_confidence": " AUTO ", "data_dir": tmp_path},
        environ={},
    )
    assert (api_token_scope(settings), router_min_confidence(settings)) == ("writes,route", None)
    assert settings.data_dir == str(tmp_path) and settings.resolved_data_dir() == tmp_path
    assert router_min_confidence(load_settings({"router_min_confidence": 0.25}, environ={})) == 0.25
    assert load_settings({"dtype": "BF16"}, environ={}).dtype == "BF16"  # checked, kept as given
    with pytest.raises(
        SettingsError, match=r"^SPECROUTE_API_TOKEN_SCOPE: expected one of writes, writes,route, all"
    ):
        load_settings(environ={"SPECROUTE_API_TOKEN_SCOPE": "everything"})


def test_secrets_stay_out_of_the_repr_and_the_errors():
    settings = load_settings({"api_token": "t0ken-VALUE", "secret_key": "k" * 40}, environ={})
    assert "t0ken-VALUE" not in repr(settings) and "kkkk" not in repr(settings)
    assert settings.api_token == "t0ken-VALUE"
    with pytest.raises(SettingsError) as caught:
        load_settings({"secret_key": ["not", "text"]}, environ={})
    assert str(caught.value) == "SPECROUTE_SECRET_KEY: expected text, got (hidden)"


def test_the_settings_are_frozen_and_read_the_process_environment_only_through_load_settings(monkeypatch):
    monkeypatch.setenv("SPECROUTE_MAX_PROMPTS", "12")
    monkeypatch.setenv("SPECROUTE_DEVICE", "cpu")
    assert load_settings().max_prompts == 12 and load_settings({"max_prompts": 4}).max_prompts == 4
    assert load_settings(environ={}).max_prompts == 50_000  # a given environment replaces os.environ
    assert (Settings().max_prompts, Settings(device="cuda:1").device) == (50_000, "cuda:1")
    settings = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.max_prompts = 3
