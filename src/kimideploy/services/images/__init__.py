"""Image commands: list, Dockerfile, verify, build, lock."""
