"""checkov, a peer policy suite, in a virtualenv of its own (it pins hundreds of packages that must
not mix with kimideploy's), cached by version under ~/.cache/kimideploy/venvs/.

`python tests/policy.py` builds it ahead (scripts/test does, beside the other downloads) and
prints where it is. checkov always runs with --skip-download: without it it calls its vendor's
API at start, which nothing here may reach.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kimideploy.images.cache_lock import building

CHECKOV = "3.3.30"


def checkov_venv() -> Path:
    root = Path(os.environ.get("KIMIDEPLOY_CACHE", Path.home() / ".cache" / "kimideploy"))
    venv = root / "venvs" / f"checkov-{CHECKOV}"
    if (venv / ".complete").is_file():
        return venv
    with building(venv):
        if not (venv / ".complete").is_file():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                            f"checkov=={CHECKOV}"], check=True, timeout=1800)  # fmt: skip
            (venv / ".complete").write_text(CHECKOV)
    return venv


def checkov_binary() -> Path:
    return checkov_venv() / "bin" / "checkov"


if __name__ == "__main__":
    print(checkov_binary())
