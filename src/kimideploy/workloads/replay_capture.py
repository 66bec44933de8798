"""replay-capture: the serving engine's hidden states of conversations as they are served.

The first container of the replay Job (`drafter doctor`, `drafter check --replay`), on the
cluster's serve image (its extraction image when the serve image's vLLM cannot extract). One vLLM
engine, set up as extraction sets it up (extract_vllm.py: the `extract_hidden_states` method and
its connector, prefix caching off), does two things:

1. answers prompts, greedy, with vLLM's own chat rendering (`LLM.chat`, the served template): the
   user's prompt sets and the prompts of each drafter's replay sample (the held-out conversations
   training judged it on). The proposer of `extract_hidden_states` drafts the token just sampled
   and verification keeps the target's greedy choice, so the answers are the target's own;
2. prefills every sequence to judge (max_tokens 1) and keeps the captured states: the answered
   conversations, each replay conversation as training rendered it (its stored token ids) and as
   the served template renders it (kimideploy's renderer, which mirrors vLLM's).

Sequences are stored by the sha256 of their token ids and loss mask under `capture_dir`, so the
same conversation is captured once for every drafter and every later replay of the same served
configuration, and a restarted pod resumes where it stopped. `index-<run id>.json` names, for each
request, the sequence that answers it; replay-judge reads only that.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimideploy.config.specs import ReplaySpec
from kimideploy.formats import extraction_engine
from kimideploy.formats.chat_template import load_tokenizer, render_sample, template_messages
from kimideploy.workloads import connector_files, replay_sample
from kimideploy.workloads.extract_vllm import ExtractionMismatchError, convert
from kimideploy.workloads.runtime import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInputError,
    Stopper,
    atomic_write,
    emit,
    log,
)


def index_file(root: Path, run_id: str) -> Path:
    """Each replay's own index: two replays may share the captured sequences."""
    return root / f"index-{run_id}.json"


ANSWERS_FILE = "answers.json"
BATCH = 32


def sequence_key(ids: list[int], mask: list[int]) -> str:
    return hashlib.sha256(json.dumps([ids, mask]).encode()).hexdigest()[:32]


def prompt_key(messages: list[dict[str, Any]], tools: Any, max_tokens: int) -> str:
    canonical = json.dumps([messages, tools, max_tokens], sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass
class Plan:
    """What to answer and what to prefill; `index` maps request names to sequence keys."""

    prompts: dict[str, tuple[list[dict[str, Any]], Any]] = field(default_factory=dict)
    """prompt key -> (messages, tools) to answer."""
    sequences: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    index: dict[str, dict[str, Any]] = field(default_factory=dict)
    """request -> {"sequence": key} or {"answer": prompt key} (resolved after answering)."""
    rendering: dict[str, dict[str, Any]] = field(default_factory=dict)
    """drafter -> how the served template's ids compare with training's."""

    def prefill(self, name: str, ids: list[int], mask: list[int]) -> None:
        key = sequence_key(ids, mask)
        self.sequences[key] = (ids, mask)
        self.index[name] = {"sequence": key}

    def answer(
        self, name: str, messages: list[dict[str, Any]], tools: Any, max_tokens: int
    ) -> None:
        key = prompt_key(messages, tools, max_tokens)
        self.prompts[key] = (messages, tools)
        self.index[name] = {"answer": key}


def request_name(group: str, conversation: str) -> str:
    return f"{group}/{conversation}"


def plan(spec: ReplaySpec, tokenizer: Any) -> Plan:
    found = Plan()
    for drafter in spec.drafters:
        rows = replay_sample.read(Path(drafter.path))
        if rows is None:
            log(f"drafter {drafter.name}: no replay sample beside it; only the prompt sets replay")
            continue
        differ: list[tuple[dict[str, Any], list[int]]] = []
        for row in rows:
            trained_ids, trained_mask = row["input_ids"], row["loss_mask"]
            found.prefill(
                request_name(f"trained:{drafter.name}", row["id"]), trained_ids, trained_mask
            )
            served = render_sample(tokenizer, row)
            found.prefill(
                request_name(f"rendered:{drafter.name}", row["id"]), served.ids, served.loss_mask
            )
            if served.ids != trained_ids:
                differ.append((row, served.ids))
            found.answer(
                request_name(f"answered:{drafter.name}", row["id"]),
                row["messages"],
                row.get("tools"),
                spec.max_tokens,
            )
        found.rendering[drafter.name] = {
            "conversations": len(rows),
            "differ": len(differ),
            "first_difference": _first_difference(differ[0], tokenizer) if differ else "",
        }
    for prompt_set in spec.prompt_sets:
        for row in prompt_set.rows:
            found.answer(
                request_name(f"prompts:{prompt_set.name}", str(row["id"])),
                row["messages"],
                row.get("tools"),
                spec.max_tokens,
            )
    return found


def _require_drafter(name: str, folder: Path) -> None:
    """The drafter must be on this cluster's models volume before an engine starts: a drafter
    trained on another cluster reaches it by publishing and pulling, not by the replay."""
    if not (folder / "config.json").is_file():
        raise BadInputError(
            f"drafter {name}: {folder} is not on this cluster's models volume (no config.json)",
            hint=(
                f"a drafter trained elsewhere: `kimideploy drafter publish {name} --cluster "
                "CLUSTER`, then the replay pulls it by digest; a hub drafter: `kimideploy host "
                "sync-model` puts it there"
            ),
        )


def _first_difference(first: tuple[dict[str, Any], list[int]], tokenizer: Any) -> str:
    """Where the first differing conversation's renderings part, as text: what a user reads to
    see which template (or tokenizer) training used."""
    row, served = first
    trained = row["input_ids"]
    at = next(
        (i for i, (a, b) in enumerate(zip(served, trained, strict=False)) if a != b),
        min(len(served), len(trained)),
    )
    window = slice(max(at - 4, 0), at + 12)
    return (
        f"conversation {row['id']}, token {at}: trained {tokenizer.decode(trained[window])!r}, "
        f"served {tokenizer.decode(served[window])!r}"
    )


def engine_kwargs(spec: ReplaySpec, storage: Path) -> dict[str, Any]:
    """The extraction engine (extract_vllm.engine_kwargs) over the replay's layers, long enough
    for a prompt and its answer."""
    size = extraction_engine.EngineSize(
        max_model_len=spec.max_seq_len + spec.max_tokens,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        max_num_batched_tokens=spec.max_num_batched_tokens,
    )
    return extraction_engine.llm_kwargs(
        spec.target,
        tensor_parallel_size=spec.tensor_parallel_size,
        dtype=spec.dtype,
        vllm_ids=list(spec.layer_ids),
        storage=str(storage),
        size=size,
    )


def run(spec: ReplaySpec) -> int:
    for drafter in spec.drafters:  # before the tokenizer, the engine, or anything is written
        _require_drafter(drafter.name, Path(drafter.path))
    root = Path(spec.capture_dir)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(spec.target.path)
    work = plan(spec, tokenizer)
    if not work.index:
        raise BadInputError(
            "nothing to replay: no drafter carries a replay sample and no prompts were given",
            hint="pass --prompts FILE (JSON Lines of prompts or conversations)",
        )
    answers = _read_json(root / ANSWERS_FILE)
    stopper = Stopper()
    storage = root / ".vllm-hidden-states"
    storage.mkdir(exist_ok=True)
    todo_answers = [k for k in work.prompts if k not in answers]
    _with_answers(work, answers)
    todo = [k for k in work.sequences if not (root / f"{k}.safetensors").is_file()]
    llm = None
    if todo_answers or todo:
        from vllm import LLM

        llm = LLM(**engine_kwargs(spec, storage))
    agreement = {"prompts": 0, "same": 0}
    if todo_answers:
        assert llm is not None
        for first in range(0, len(todo_answers), BATCH):
            if stopper.stopping:
                return EXIT_INTERRUPTED
            batch = todo_answers[first : first + BATCH]
            for key, ids, mask in _answer(llm, spec, [(k, *work.prompts[k]) for k in batch]):
                answers[key] = {"ids": ids, "mask": mask}
            atomic_write(root / ANSWERS_FILE, json.dumps(answers).encode())
            emit({"event": "progress", "stage": "replay-capture", "answered": len(answers)})
    for key, prompt in work.prompts.items():
        _compare_prompt(
            tokenizer, prompt, answers[key]["ids"], answers[key]["mask"], agreement=agreement
        )
    _with_answers(work, answers)
    todo = [k for k in work.sequences if not (root / f"{k}.safetensors").is_file()]
    if todo:
        assert llm is not None
        code = _prefill(
            llm, spec, root, storage, todo=[(k, *work.sequences[k]) for k in todo], stopper=stopper
        )
        if code != EXIT_OK:
            return code
    from importlib.metadata import version

    record = {
        "requests": work.index,
        "rendering": work.rendering,
        "renderer_agreement": agreement,
        "engine": f"vllm {version('vllm')}",
        "image": spec.capture_image,
        "note": spec.capture_note,
    }
    index = json.dumps(record, indent=1, sort_keys=True).encode()
    atomic_write(index_file(root, spec.run_id), index)
    emit(
        {
            "event": "result",
            "stage": "replay-capture",
            "sequences": len(work.sequences),
            "captured": len(todo),
            "answered": len(todo_answers),
            "rendering": work.rendering,
            "renderer_agreement": agreement,
        }
    )
    log(
        f"captured {len(todo)} of {len(work.sequences)} sequences ({len(todo_answers)} answered) "
        f"into {root}"
    )
    return EXIT_OK


def _with_answers(work: Plan, answers: dict[str, Any]) -> None:
    """Each request whose answer is known becomes the sequence (prompt + answer) to prefill."""
    for name, entry in list(work.index.items()):
        if "answer" in entry and entry["answer"] in answers:
            answered = answers[entry["answer"]]
            work.prefill(name, answered["ids"], answered["mask"])


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except ValueError:
        log(f"{path} is unreadable (an interrupted write); answering again")
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _answer(
    llm: Any, spec: ReplaySpec, batch: list[tuple[str, list[dict[str, Any]], Any]]
) -> list[tuple[str, list[int], list[int]]]:
    """Greedy answers by the served engine with its own chat rendering, grouped by tools (one
    `LLM.chat` call takes one tool list)."""
    from vllm import SamplingParams

    greedy = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0)
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    tools_of: dict[str, Any] = {}
    for key, messages, tools in batch:
        group = json.dumps(tools, sort_keys=True)
        groups.setdefault(group, []).append((key, messages))
        tools_of[group] = tools
    out = []
    for group, items in groups.items():
        results = llm.chat(
            [m for _, m in items], greedy, use_tqdm=False, tools=tools_of[group] or None
        )
        for (key, _), result in zip(items, results, strict=True):
            written = (result.kv_transfer_params or {}).get("hidden_states_path")
            if written:  # the states of a generation request: not what is judged
                connector_files.discard(Path(written))
            prompt = list(result.prompt_token_ids or [])
            answer = list(result.outputs[0].token_ids)
            out.append((key, prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return out


def _compare_prompt(
    tokenizer: Any,
    prompt: tuple[list[dict[str, Any]], Any],
    ids: list[int],
    mask: list[int],
    *,
    agreement: dict[str, int],
) -> None:
    """Does kimideploy's renderer give the prompt ids vLLM rendered? (It renders training's.)"""
    messages, tools = prompt
    mine = tokenizer.apply_chat_template(
        template_messages(messages),
        tools=tools or None,
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    served = ids[: len(mask) - sum(mask)]
    agreement["prompts"] += 1
    agreement["same"] += int(list(mine) == served)


def _prefill(
    llm: Any,
    spec: ReplaySpec,
    root: Path,
    storage: Path,
    *,
    todo: list[tuple[str, list[int], list[int]]],
    stopper: Stopper,
) -> int:
    import torch
    from safetensors.torch import save_file
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    once = SamplingParams(max_tokens=1, temperature=0.0)
    dtype = getattr(torch, spec.dtype)
    aux_count = len(spec.layer_ids)
    for first in range(0, len(todo), BATCH):
        if stopper.stopping:
            return EXIT_INTERRUPTED
        batch = todo[first : first + BATCH]
        prompts = [TokensPrompt(prompt_token_ids=ids) for _, ids, _ in batch]
        outputs = llm.generate(prompts, once, use_tqdm=False)
        for (key, ids, mask), output in zip(batch, outputs, strict=True):
            path = Path((output.kv_transfer_params or {}).get("hidden_states_path") or "")
            if not path.name or not connector_files.exists(path):
                raise ExtractionMismatchError(f"vLLM reported no hidden-states file for {key}")
            tensors = convert(connector_files.read(path), ids, mask, aux_count, dtype=dtype)
            connector_files.remove(path)
            partial = root / f".{key}.partial.safetensors"
            save_file(tensors, str(partial))
            partial.rename(root / f"{key}.safetensors")
        emit(
            {
                "event": "progress",
                "stage": "replay-capture",
                "captured": min(first + BATCH, len(todo)),
                "of": len(todo),
            }
        )
    return EXIT_OK
