"""The operator's console behind ``flowscope ui``: a local web page over the store.

:mod:`.app` is the ASGI app (Starlette) and its guard, :mod:`.api` the rows it serves (the
CLI's views), :mod:`.live` the change feed its pages follow; ``static/`` holds the page
(ES modules, CSS, SVG; no build step). Needs the ``ui`` extra (Starlette, uvicorn).
"""

from __future__ import annotations

__all__: list[str] = []
