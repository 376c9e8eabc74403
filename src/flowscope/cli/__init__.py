"""The ``flowscope`` command: run the demo, and inspect, audit, resume and export runs.

Every command works on a SQLite store: ``--db PATH``, else ``$FLOWSCOPE_DB``, else
``./flowscope.db``. Listing commands take ``--format table|json|csv``; JSON is a list of
objects whose keys are documented in ``docs/cli.md``. A problem with the database, a
session or an argument is one line on stderr and exit code 2, never a traceback
(``FLOWSCOPE_DEBUG=1`` shows the traceback of an unexpected error).

- :mod:`.app`: the click group, shared options, opening the store, the error handler, ``main``
- :mod:`.failures`: exception class -> one-line error and exit code (one table)
- :mod:`.inspect_cmds`: runs, show, audit, stuck, export (read the store)
- :mod:`.operate_cmds`: resume, prune, serve-metrics (act on it)
- :mod:`.action_cmds`: retry, cancel (an operator's actions, through the inbox)
- :mod:`.demo_cmd`: demo
- :mod:`.deploy_cmd`: deploy-files (the dashboards and collector configs the package ships)
- :mod:`.ui_cmd`: ui (the console, :mod:`flowscope.console`)
- :mod:`.worker_cmds`: worker, start (run ownership: workers serve submitted runs)
- :mod:`.views` (rows), :mod:`.tables` and :mod:`.render` (drawing them), :mod:`.progress`,
  :mod:`.runtime` (tracing, metrics server, signals)
"""

from __future__ import annotations

from . import action_cmds, demo_cmd, deploy_cmd, inspect_cmds, operate_cmds, ui_cmd, views, worker_cmds
from .app import DEFAULT_DB, ENV_DB, cli, main
from .failures import CliError

__all__ = ["main", "cli", "CliError", "DEFAULT_DB", "ENV_DB", "views"]

for _command in (
    *inspect_cmds.COMMANDS,
    *operate_cmds.COMMANDS,
    *action_cmds.COMMANDS,
    *worker_cmds.COMMANDS,
    *demo_cmd.COMMANDS,
    *ui_cmd.COMMANDS,
    *deploy_cmd.COMMANDS,
):
    cli.add_command(_command)
