"""The gate: bench a revision, judge it against a baseline, keep it or roll it back."""
