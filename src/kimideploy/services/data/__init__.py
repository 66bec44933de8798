"""Datasets on a data volume: `data inspect`."""
