"""Bridges that record flowscope's event catalog for other engines' runs.

- :mod:`flowscope.adapters.adk`: ``FlowscopeADK`` for the Agent Development Kit (extra
  ``flowscope[adk]``);
- :mod:`flowscope.adapters.langgraph`: ``FlowscopeCallbackHandler`` for LangGraph (extra
  ``flowscope[langgraph]``).

Each bridge imports its engine, so import the submodule you need; this package imports
neither.
"""

__all__: list[str] = []
