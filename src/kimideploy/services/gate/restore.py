"""Putting back the revision that served before a sequence of measurement revisions (`run
calibrate`, the bake-off of `run bench --drafters`), also after a failure."""

from __future__ import annotations

from kimideploy.cluster.records import ReleaseRecord
from kimideploy.cluster.session import ClusterSession
from kimideploy.errors import KimiDeployError
from kimideploy.services.release import deploy
from kimideploy.services.reporting import Reporter


def restore_serving(
    session: ClusterSession,
    release: str,
    found: ReleaseRecord | None,
    latest: int | None,
    *,
    apply: deploy.ApplyOptions,
    reporter: Reporter,
    after: str,
) -> str:
    """Restore `found` (or take the release down when nothing served) if `latest`, a revision
    deployed for the measurement, is serving now; say what was done. `after` names the
    measurement in the history note ("calibration 1a2b3c")."""
    if latest is None:
        return "nothing was deployed, nothing to restore"
    try:
        if found is None:
            deploy.down(session, release, apply.change, reporter)
            return f"nothing served before the {after}, so the release was taken down again"
        target = deploy.RollbackTo(
            to=found.revision, note=f"restored after {after}", expect_serving=latest
        )
        deploy.rollback(session, release, target, apply.unattended(auto_rollback=False), reporter)
    except deploy.StaleRollbackError as exc:
        return f"not restored: {exc.message}"
    except KimiDeployError as exc:
        return (
            f"restoring revision {found.revision if found else '-'} failed: {exc.message}; "
            f"`kimideploy rollback serve --to {found.revision if found else 'N'}` retries it"
        )
    return f"restored revision {found.revision} ({found.drafter}), which served before"
