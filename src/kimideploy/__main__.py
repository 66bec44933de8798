"""`python -m kimideploy` runs the CLI."""

from kimideploy.cli.launch import entrypoint

entrypoint()
