"""Pure readers and writers shared by the CLI and the pods (stdlib only, nothing of ours)."""
