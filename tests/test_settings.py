"""Settings: defaults, then SPECROUTE_* environment, then explicit overrides; bad values named."""

from __future__ import annotations

import pytest

from analyzer.settings import SettingsError, load_settings


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
