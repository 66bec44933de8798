"""One check's outcome, the row shape shared by `drafter check`, `host check` and `image verify`
(and the drafter init container, which prints the same rows)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # A failed non-blocking check is a warning: shown, but it does not stop a deploy.
    blocking: bool = True

    @property
    def status(self) -> str:
        return "pass" if self.ok else ("FAIL" if self.blocking else "warn")
