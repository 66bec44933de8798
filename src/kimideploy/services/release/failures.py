"""What to do about each way a revision fails to serve: one fix line per failure the rollout
watcher names (cluster/rollout.py, services/release/swap.py, the transaction's own), printed
under the failure and listed in docs/usage/troubleshooting.md (tests/unit/test_failures.py
keeps the two equal)."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "FailedScheduling": (
        "no node can take the pod: the message says which resource is short (GPUs, RDMA "
        "devices, memory, a taint); `kimideploy status` shows what else holds the GPUs, "
        "`kimideploy plan requirements` what the release needs of a node"
    ),
    "ImagePull": (
        "the node cannot pull the image: check the digest (`kimideploy image list`), the pull "
        "credentials (`kimideploy prepare` creates the registry Secret) and that the node "
        "reaches the registry"
    ),
    "CrashLoop": (
        "the server exits again and again: the log lines say why (`kimideploy logs serve` for "
        "all of them); killed for memory, the plan's `memory` and `page cache` lines say what "
        "the pod holds (`kimideploy up serve --dry-run`)"
    ),
    "InitFailed": (
        "a check before the load failed, named in the message: gpu-check (the GPUs, the "
        "driver, the image's architectures: `kimideploy host check`), model-check (`kimideploy "
        "host sync-model`), drafter-check (`kimideploy drafter check`), artifact-pull "
        "(`kimideploy drafter pull`)"
    ),
    "StartupBudget": (
        "the server did not answer within workloads.serve.startup_budget_s: `kimideploy status` "
        "shows the start-up by phase; a cold page cache or slow storage (`kimideploy host "
        "check --storage`) or a cold compile cache makes it slow: raise the budget where the "
        "phases still progress"
    ),
    "ProgressDeadline": (
        "the Deployment made no progress within its deadline: `kubectl describe deployment` and "
        "`kimideploy status` say where its pods stopped"
    ),
    "Deleted": "the Deployment was deleted while it rolled out: run `kimideploy up serve` again",
    "Timeout": (
        "the rollout did not finish within --timeout: `kimideploy status` says where it is; "
        "run again with a longer --timeout, or `kimideploy rollback serve`"
    ),
    "SwapRefused": (
        "the running server refused the new drafter's files (the reason says which key or "
        "tensor differs): the revision was rolled out as a restart instead"
    ),
    "SwapTimeout": (
        "the pods did not all serve the new drafter (or switch speculation) within --timeout: "
        "the message names each pod's state; `kimideploy status` shows what each serves, and "
        "`--no-swap` replaces the pods instead"
    ),
    "KeepersUnreachable": (
        "the pods' keepers did not answer through the API server's pod proxy (a NetworkPolicy, "
        "`network_policy.api_server_cidrs`): the revision was rolled out instead"
    ),
    "ApplyRejected": (
        "the API server refused an object (the message names it and why); nothing of the "
        "revision serves"
    ),
}


def fix(failure: str | None) -> str:
    """The fix line for `failure` ("" for a failure without one)."""
    return FIXES.get(failure or "", "")


FAILURES_BEGIN = "<!-- failures: generated from services/release/failures.py -->"
FAILURES_END = "<!-- end of failures -->"


def markdown() -> str:
    """The table docs/usage/troubleshooting.md carries."""
    rows = ["| failure | what to do |", "|---|---|"]
    rows += [f"| {name} | {text} |" for name, text in FIXES.items()]
    return "\n".join(rows) + "\n"


def with_fixes(page: str) -> str:
    before, begin, rest = page.partition(FAILURES_BEGIN)
    _, end, after = rest.partition(FAILURES_END)
    if not begin or not end:
        raise ValueError("the page has no failures markers")
    return f"{before}{FAILURES_BEGIN}\n{markdown()}{FAILURES_END}{after}"
