"""The web UI and the command line over the analyzer and the router (Flask, click)."""
