"""`drafter refresh`: what to learn from served traffic, and whether the refreshed drafter may
replace the serving one.

Choosing (from the capture sidecar's records, workloads/capture_proxy.py): the records are
grouped by their key (one conversation, however often it was sent); a conversation's weight is
the draft tokens the serving drafter had rejected on it over every time it was served, which is
low acceptance and share of the traffic in one figure (a rare prompt the drafter fails on and a
frequent one it half-accepts both cost rejected drafts, in proportion to what they cost serving).
Conversations without a reported acceptance are counted, not ranked. A fixed share of the
conversations, chosen by a hash of their key (never by rank, so the judgement's set is not the
hardest prompts only), is held out: never regenerated for training, judged on afterwards.

Judging (the verdict names both sets): the refreshed drafter must beat the serving one on the
captured held-out conversations beyond the paired interval (its lower bound above zero), and
must not lose on the general held-out set beyond its interval (its upper bound not below zero).
Either failing refuses it, saying which and by how much.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

REFRESH_SALT = "kimideploy-refresh-v1"
HELD_OUT_FRACTION = 0.2


def held_out(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"{REFRESH_SALT}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


@dataclass
class CapturedConversation:
    """One conversation as served, over every time it was sent."""

    key: str
    endpoint: str
    conversation: Any
    """The messages (chat) or the prompt (completions) as recorded."""
    max_tokens: int | None
    requests: int = 0
    reported: int = 0
    """Requests whose answer carried the request's own acceptance."""
    draft_tokens: int = 0
    accepted: int = 0
    days: set[str] = field(default_factory=set)

    @property
    def rejected(self) -> int:
        return self.draft_tokens - self.accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    def lineage(self, share: float) -> dict[str, Any]:
        """Where the sample came from: what `drafter refresh` writes beside each prompt."""
        return {
            "source": "capture",
            "key": self.key,
            "requests": self.requests,
            "share_of_requests": round(share, 6),
            "acceptance_rate": None
            if self.acceptance_rate is None
            else round(self.acceptance_rate, 4),
            "rejected_draft_tokens": self.rejected,
            "days": sorted(self.days),
        }


def grouped(rows: Iterable[dict[str, Any]]) -> list[CapturedConversation]:
    """The capture's records by conversation; a malformed record is skipped (counted by the
    caller as the difference)."""
    found: dict[str, CapturedConversation] = {}
    for row in rows:
        key, endpoint = row.get("key"), row.get("endpoint")
        if not isinstance(key, str) or endpoint not in ("chat", "completions"):
            continue
        conversation = row.get("messages") if endpoint == "chat" else row.get("prompt")
        if not conversation:
            continue
        entry = found.setdefault(
            key, CapturedConversation(key, endpoint, conversation, row.get("max_tokens"))
        )
        entry.requests += 1
        if isinstance(row.get("day"), str):
            entry.days.add(row["day"])
        acceptance = row.get("acceptance")
        if isinstance(acceptance, dict) and isinstance(acceptance.get("num_draft_tokens"), int):
            entry.reported += 1
            entry.draft_tokens += int(acceptance["num_draft_tokens"])
            entry.accepted += int(acceptance.get("num_accepted_draft_tokens") or 0)
    return list(found.values())


@dataclass(frozen=True)
class Selection:
    train: list[CapturedConversation]
    held_out: list[CapturedConversation]
    unranked: int
    """Conversations without a reported acceptance: counted, never chosen."""
    requests: int
    rejected_covered: float
    """Of the rejected draft tokens on the training side, the share the chosen ones carry."""


def select(
    conversations: list[CapturedConversation],
    *,
    max_prompts: int,
    held_out_fraction: float = HELD_OUT_FRACTION,
) -> Selection:
    ranked = [c for c in conversations if c.draft_tokens > 0]
    judged = sorted((c for c in ranked if held_out(c.key, held_out_fraction)), key=_by_cost)
    candidates = sorted((c for c in ranked if not held_out(c.key, held_out_fraction)),
                        key=_by_cost)  # fmt: skip
    chosen = candidates[:max_prompts]
    total = sum(c.rejected for c in candidates)
    return Selection(
        train=chosen,
        held_out=judged,
        unranked=len(conversations) - len(ranked),
        requests=sum(c.requests for c in conversations),
        rejected_covered=sum(c.rejected for c in chosen) / total if total else 0.0,
    )


def _by_cost(conversation: CapturedConversation) -> tuple[int, str]:
    return (-conversation.rejected, conversation.key)


def prompt_rows(chosen: list[CapturedConversation], requests: int) -> list[dict[str, Any]]:
    """JSON Lines rows datagen and the bench read ({id, messages} or {id, prompt}), each with
    its lineage."""
    rows = []
    for conversation in chosen:
        body = "messages" if conversation.endpoint == "chat" else "prompt"
        share = conversation.requests / requests if requests else 0.0
        rows.append(
            {
                "id": f"capture-{conversation.key}",
                body: _prompt_only(conversation.conversation),
                "lineage": conversation.lineage(share),
            }
        )
    return rows


def _prompt_only(conversation: Any) -> Any:
    """The prompt the target answers again: a chat's messages up to its last user turn (the
    served answer is the target's to regenerate, never reused)."""
    if not isinstance(conversation, list):
        return conversation
    last_user = max((i for i, m in enumerate(conversation) if m.get("role") == "user"), default=-1)
    return conversation[: last_user + 1] if last_user >= 0 else conversation


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)


@dataclass(frozen=True)
class RefreshVerdict:
    keep: bool
    reason: str
    captured: dict[str, Any]
    general: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "reason": self.reason, "captured": self.captured,
                "general": self.general}  # fmt: skip


def verdict(captured: dict[str, Any], general: dict[str, Any]) -> RefreshVerdict:
    """`captured` and `general`: paired differences of the refreshed drafter's mean acceptance
    length minus the serving drafter's at k (paired_requests, or training's
    workloads/heldout.paired_difference) on the captured held-out conversations and the general
    held-out set. The gain must clear the paired interval; on the general set the refreshed
    figure must stay within the serving drafter's own interval (paired_requests carries it)."""

    def said(name: str, found: dict[str, Any]) -> str:
        low, high = found["ci95"]
        return (
            f"{name} {found['difference']:+.3f} tokens per step at k={found['k']} "
            f"(95% {low:+.3f} to {high:+.3f}, {found['turns']} turns)"
        )

    gains = captured["ci95"][0] > 0
    if "serving_ci95" in general:
        # "Not lose beyond its interval": the refreshed drafter's figure on the general set
        # within (or above) the serving drafter's own 95% interval there.
        holds = general["candidate"] >= general["serving_ci95"][0]
    else:  # a paired difference alone (training's judgement): its interval must reach zero
        holds = general["ci95"][1] >= 0
    both = f"{said('captured traffic', captured)}; {said('general held-out', general)}"
    if "serving_ci95" in general:
        low, high = general["serving_ci95"]
        both += (
            f"; general: refreshed {general['candidate']:.3f} against the serving drafter's "
            f"{general['serving']:.3f} (95% {low:.3f} to {high:.3f})"
        )
    if gains and holds:
        reason = f"beats the serving drafter on the traffic and holds elsewhere: {both}"
    elif not gains and not holds:
        reason = f"no gain beyond the interval on the traffic, and a loss elsewhere: {both}"
    elif not gains:
        reason = f"no gain beyond the interval on the captured traffic: {both}"
    else:
        reason = f"loses on the general held-out set beyond its interval: {both}"
    return RefreshVerdict(gains and holds, reason, captured, general)


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261208


def paired_requests(
    serving: list[dict[str, Any]], refreshed: list[dict[str, Any]], k: int
) -> dict[str, Any]:
    """The refreshed drafter's mean acceptance length minus the serving one's, from vLLM's own
    per-request counts (`metrics.speculative_decoding`) on the same prompts in the same order,
    with a 95% interval from a paired bootstrap over the prompts: the figure `verdict` reads.
    The mean acceptance length is vLLM's: 1 + accepted draft tokens per verification step."""
    if len(serving) != len(refreshed):
        raise ValueError(f"paired judgements of {len(serving)} and {len(refreshed)} prompts")
    rows = [
        (a["num_accepted_draft_tokens"], a["num_spec_steps"],
         b["num_accepted_draft_tokens"], b["num_spec_steps"])
        for a, b in zip(serving, refreshed, strict=True)
    ]  # fmt: skip

    def difference(chosen: list[tuple[int, int, int, int]]) -> float:
        totals = [sum(column) for column in zip(*chosen, strict=True)] or [0, 0, 0, 0]
        mine = 1 + totals[2] / totals[3] if totals[3] else 1.0
        theirs = 1 + totals[0] / totals[1] if totals[1] else 1.0
        return mine - theirs

    draw = random.Random(BOOTSTRAP_SEED)
    spread = sorted(
        difference([rows[draw.randrange(len(rows))] for _ in rows])
        for _ in range(BOOTSTRAP_RESAMPLES if rows else 0)
    )
    low, high = (
        (spread[int(0.025 * BOOTSTRAP_RESAMPLES)], spread[int(0.975 * BOOTSTRAP_RESAMPLES) - 1])
        if spread
        else (0.0, 0.0)
    )
    return {
        "k": k,
        "turns": len(rows),
        "difference": round(difference(rows), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "method": f"paired bootstrap over prompts, {BOOTSTRAP_RESAMPLES} resamples",
        "serving": round(_mean_length([r[:2] for r in rows]), 4),
        "candidate": round(_mean_length([r[2:] for r in rows]), 4),
        "serving_ci95": _interval([r[:2] for r in rows]),
    }


def _mean_length(counts: list[tuple[int, int]]) -> float:
    steps = sum(s for _, s in counts)
    return 1 + sum(a for a, _ in counts) / steps if steps else 1.0


def _interval(counts: list[tuple[int, int]]) -> list[float]:
    """A 95% interval of one drafter's mean acceptance length, bootstrapped over prompts."""
    if not counts:
        return [1.0, 1.0]
    draw = random.Random(BOOTSTRAP_SEED)
    spread = sorted(
        _mean_length([counts[draw.randrange(len(counts))] for _ in counts])
        for _ in range(BOOTSTRAP_RESAMPLES)
    )
    return [
        round(spread[int(0.025 * BOOTSTRAP_RESAMPLES)], 4),
        round(spread[int(0.975 * BOOTSTRAP_RESAMPLES) - 1], 4),
    ]
