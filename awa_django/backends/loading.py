"""Which stored dotted paths awa_django may import: the worker resolving a task, ``get_result``
naming an exception class. Only modules already imported, or of an installed app or
``AWA["JOB_MODULES"]``, are ever imported, so a row written by hand cannot make a worker import
arbitrary code."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from django.apps import apps

from awa_django.conf import get_awa_settings

__all__ = ["attribute_at", "importable_module"]


def importable_module(module: str) -> bool:
    """True when ``module`` is (in) an installed app or ``AWA["JOB_MODULES"]``: the only
    modules a stored path may make the worker or ``get_result`` import."""
    roots = [config.name for config in apps.get_app_configs()]
    roots.extend(get_awa_settings().JOB_MODULES)
    return any(module == root or module.startswith(root + ".") for root in roots)


def attribute_at(path: str) -> Any | None:
    """The top-level attribute ``module.name`` names, or None. Only modules already imported,
    or of an installed app or ``AWA["JOB_MODULES"]``, are imported; one that fails to import
    is None."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr.isidentifier():
        return None  # "f.<locals>.Error" and the like
    module = sys.modules.get(module_name)
    if module is None:
        if not importable_module(module_name):
            return None
        try:
            module = importlib.import_module(module_name)
        except Exception:
            return None
    return getattr(module, attr, None)
