"""The hub downloader's command line, for its two callers: the weights Job (workloads/weights.py,
inside the cluster) and `host sync-model` (services/hosts/model_sync.py, over SSH).

The downloader itself (remote/payloads/hub_sync.py) runs on hosts without kimideploy, standard
library only, so it cannot import this: its argparse is the other side of this function, and the
tests run it with what this builds (tests/integration/test_hub_download.py)."""

from __future__ import annotations


def downloader_command(
    python: str, script: str, *, endpoint: str, repo: str, revision: str, dest: str, streams: int
) -> list[str]:
    """`python script ...` for one repository at one revision into `dest`; the token is not an
    argument (a command line is visible to every process on the machine): it goes on stdin."""
    return [
        python,
        script,
        "--endpoint",
        endpoint,
        "--repo",
        repo,
        "--revision",
        revision,
        "--dest",
        dest,
        "--streams",
        str(streams),
    ]
