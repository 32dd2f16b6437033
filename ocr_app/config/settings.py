"""Settings: a YAML file overridden by OCR_APP_* environment variables, validated once at start. Each setting
lives in the model of its concern (engine.py, service.py, jobs.py); Settings puts them together with the rules
that tie them to each other."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path

import yaml
from pydantic import ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ..egress import allowed_host_entry
from ..urls import prefix_problem  # httpx's parser: the one that sends the webhooks
from .base import VLLM_PAGE_TOKENS, ConfigError
from .engine import EngineSettings
from .jobs import JobSettings
from .service import NetworkSettings, OperationSettings, RequestSettings

# The YAML file to read for the next Settings() call; set by load_settings().
_config_file: ContextVar[Path | None] = ContextVar("ocr_app_config_file", default=None)


# The bases' order is the settings' order in the reference (pydantic takes the last base's fields first).
class Settings(
    OperationSettings, JobSettings, RequestSettings, EngineSettings, NetworkSettings, BaseSettings
):
    """Every app setting: name, type, default, range and a one-line description. The kit's copies (the ocr_app
    role's defaults, argument specs and config.yml.j2; docs/configuration.md) are generated from it by
    scripts/gen_settings.py, and tests/test_settings_kit.py holds them equal."""

    model_config = SettingsConfigDict(env_prefix="OCR_APP_", extra="forbid", validate_default=True)

    @property
    def job_pages_idle(self) -> bool:
        """Job pages run at nice 19, on workers of their own (decode, and rapidocr's instances)."""
        return bool(self.database_url) and self.job_idle_priority

    def for_engine(self, engine: str) -> Settings:
        """These settings with the defaults that depend on the engine (once resolved) filled in."""
        n = self.max_concurrency or (
            self.vllm_max_num_seqs if engine == "vllm" else max(2, self.rapidocr_workers)
        )
        defaults = {
            "max_concurrency": n,
            "job_max_inflight": n,
            "job_max_interactive": self.vllm_max_num_seqs // 2 if engine == "vllm" else 0,
        }
        update = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return self.model_copy(update=update) if update else self

    @model_validator(mode="after")
    def _vllm_is_consistent(self) -> Settings:
        if self.engine == "vllm" and self.model_path is None:
            raise ValueError("model_path is required for engine vllm")
        if self.vllm_max_tokens > self.vllm_max_tokens_cap:
            raise ValueError("vllm_max_tokens must not exceed vllm_max_tokens_cap")
        if self.vllm_max_tokens_cap + VLLM_PAGE_TOKENS > self.vllm_max_model_len:
            raise ValueError(
                f"vllm_max_model_len must hold a page ({VLLM_PAGE_TOKENS} tokens at 1540 px) "
                "plus vllm_max_tokens_cap"
            )
        if any(not 0.0 <= t <= 2.0 for t in self.vllm_retry_temperatures):
            raise ValueError("vllm_retry_temperatures must lie between 0 and 2")
        return self

    @model_validator(mode="after")
    def _auth_is_explicit(self) -> Settings:
        if self.api_keys_file is None and not self.auth_disabled:
            raise ValueError(
                "api_keys_file is required (set auth_disabled: true to run without authentication)"
            )
        return self

    @model_validator(mode="after")
    def _webhook_prefixes_are_urls(self) -> Settings:
        problems = [p for p in map(prefix_problem, self.job_webhook_allowed_urls) if p is not None]
        if problems:
            raise ValueError("job_webhook_allowed_urls: " + "; ".join(problems))
        hosts = [h for h in self.job_url_allowed_hosts if not allowed_host_entry(h)]
        if hosts:
            raise ValueError(f"job_url_allowed_hosts: not a host name or an IP network: {hosts}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(settings)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown setting"
        hint = f" (env OCR_APP_{key.upper()})" if e["loc"] else ""
        lines.append(f"  {key}: {msg}{hint}")
    return "invalid configuration:\n" + "\n".join(lines)


def load_settings(config_file: Path | str | None = None, **overrides: object) -> Settings:
    """Build Settings from (in rising priority) defaults, the YAML file, env vars, overrides."""
    if config_file is None and os.environ.get("OCR_APP_CONFIG"):
        config_file = os.environ["OCR_APP_CONFIG"]
    path = Path(config_file) if config_file else None
    if path is not None and not path.is_file():
        raise ConfigError(f"invalid configuration: config file {path} does not exist")
    token = _config_file.set(path)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None
    except (OSError, ValueError, yaml.YAMLError) as err:  # unreadable or malformed YAML
        raise ConfigError(f"invalid configuration: {path}: {err}") from None
    finally:
        _config_file.reset(token)
