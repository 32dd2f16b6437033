"""What the settings' modules share: the configuration error, the reference's note on a default chosen at
start, and the units and sizes their defaults and checks are written in."""

from __future__ import annotations

from pydantic.config import JsonDict

MiB = 1024 * 1024
# The prompt of a 1540x1540 page for LightOnOCR: 55 x 55 image tokens after the 2x2 merge, and the template.
VLLM_PAGE_TOKENS = 3100


class ConfigError(Exception):
    """Configuration that cannot run; the message names each offending key."""


def default_doc(doc: str) -> JsonDict:
    """A default chosen at start (from the host or the engine), as the configuration reference gives it."""
    return {"default_doc": doc}
