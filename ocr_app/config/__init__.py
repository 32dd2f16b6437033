"""The app's settings (Settings: the one home of every setting) and how they are loaded."""

from .base import VLLM_PAGE_TOKENS, ConfigError, MiB
from .settings import Settings, load_settings

__all__ = ["VLLM_PAGE_TOKENS", "ConfigError", "MiB", "Settings", "load_settings"]
