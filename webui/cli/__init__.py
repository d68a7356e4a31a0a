"""The ``specroute`` command line (see :mod:`webui.cli.base`); importing this package registers
every command group on ``cli``."""

from webui.cli import analysis, costs, data, demo, llama_server, pools, routing, server_analysis, serving  # noqa: F401  (register the commands)
from webui.cli.base import cli, main

__all__ = ["cli", "main"]
