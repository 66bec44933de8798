"""Pure readers and writers shared by the CLI and the pods (stdlib at import, nothing of ours)."""
