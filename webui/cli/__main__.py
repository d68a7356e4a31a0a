"""``python -m webui.cli``: the same as the ``specroute`` command."""

from webui.cli import main

main()
