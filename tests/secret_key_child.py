"""What tests/test_webui.py's processes starting together run: the secret key of a data folder, generated or
read. A module of its own so that each spawned process imports only the settings and the key's code (0.3 s),
not the web UI's tests (2.5 s; six processes on 2 cores)."""

from __future__ import annotations

from analyzer.settings import load_settings
from webui.security import resolve_secret_key


def generated_key(folder: str) -> str:
    """The key ``resolve_secret_key`` gives for ``folder`` as the data folder."""
    return resolve_secret_key(load_settings({"data_dir": folder}, environ={}))
