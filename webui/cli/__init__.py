"""The ``specroute`` command line (see :mod:`webui.cli.base`); importing this package registers
every command group on ``cli``."""

from webui.cli import (  # noqa: F401  (register the commands)
    analysis,
    costs,
    data,
    demo,
    export,
    llama_server,
    pools,
    routing,
    runs,
    server_analysis,
    serving,
)
from webui.cli.base import cli, main

__all__ = ["cli", "main"]
