"""The version of awa_django, in a module of its own so that any module can read it without
running ``awa_django/__init__.py`` (which imports the producer and, through it, most of the
package). ``awa_django.__version__`` is the same value; pyproject.toml states it too."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"
