"""The command line: thin click commands over services; the only importer of click."""
