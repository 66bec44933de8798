"""`python -m kimideploy` runs the CLI."""

from kimideploy.cli.main import entrypoint

entrypoint()
