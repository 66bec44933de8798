"""Batch runs: start a workload as a new Job, follow its progress lines, read its results."""
