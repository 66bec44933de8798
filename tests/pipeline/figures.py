"""The pipeline tier's figures, in a module of their own: pytest imports the tier's conftest.py as
`conftest` while the tests import it as `tests.pipeline.conftest`, two module objects, so a dict
defined there was two dicts and the tests' figures never reached the printed summary."""

from __future__ import annotations

from typing import Any

FIGURES: dict[str, Any] = {}
