"""Project configuration: strict models of kimideploy.yaml, and loading with clear errors."""
