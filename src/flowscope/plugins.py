"""Plugins: the public home of the hook port (:mod:`flowscope.engine.hooks`).

Subclass :class:`Plugin` and override the hooks you need; see the engine module for
the order hooks run in and how their failures are isolated.
"""

from .engine.hooks import HOOKS, Plugin, PluginDispatcher

__all__ = ["Plugin", "PluginDispatcher", "HOOKS"]
