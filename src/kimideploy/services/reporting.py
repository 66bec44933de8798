"""How services talk to the person running them; the CLI provides the implementation."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def info(self, message: str) -> None:
        """A line worth keeping in the scrollback."""

    def status(self, message: str) -> None:
        """A progress update; on a TTY it replaces the previous one."""

    def confirm(self, question: str) -> bool:
        """Ask before changing a cluster; True means go ahead."""


class SilentReporter:
    """For callers that want the outcome only (tests, the promotion gate)."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def status(self, message: str) -> None:
        self.lines.append(message)

    def confirm(self, question: str) -> bool:
        self.lines.append(question)
        return self.answer
