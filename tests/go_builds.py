"""The Go builds scripts/test runs beside the first test sessions (the test control plane,
Prometheus, the OCI registry): a test that needs one of their binaries waits for them here instead
of starting a second build of the same module into the same cache folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKER_ENV = "KIMIDEPLOY_GO_BUILDS_DONE"
"""A file scripts/test creates once its Go builds have ended (built or failed); unset outside it."""
LONGEST_WAIT_S = 3600.0
"""Past this the caller builds (or fails with the build's own reason) as it would alone."""


def wait_for_go_builds() -> None:
    """Return once scripts/test's Go builds have ended; at once where no build runs beside us."""
    marker = os.environ.get(MARKER_ENV)
    if not marker:
        return
    deadline = time.monotonic() + LONGEST_WAIT_S
    while not Path(marker).exists() and time.monotonic() < deadline:
        time.sleep(2)
