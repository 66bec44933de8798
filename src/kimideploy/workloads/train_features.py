"""Where a training sample's hidden states come from: stored shards, or the target itself.

offline: the files `kimideploy run extract` wrote, checked against the drafter by train_data.
online: the target server beside the trainer (a vLLM 0.18 sidecar started with the extraction
flags of formats/extraction_engine.py) prefills each sample on request; its connector writes the
states to a pod-local scratch directory, this module reads the file, checks it token by token,
deletes it and hands the trainer the same tensors a stored sample holds. Nothing is stored, so a
run is bounded by compute, not by the ~57 KB per token a stored dataset costs.

Both sources give the trainer `input_ids`, `loss_mask`, `aux_hidden_states [layers, T, H]` and
`last_hidden_state [T, H]`, so the loop, its checkpoints and its resume are the same for both.
Requests for the next batch are sent while the current one trains (`concurrency` in flight).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from kimideploy.config.specs import OnlineTrainSpec, TrainSpec
from kimideploy.formats.chat_template import (
    RENDERED_FIELDS,
    load_tokenizer,
    template_fingerprint,
)
from kimideploy.workloads import connector_files, dataset_record, train_data
from kimideploy.workloads.conversations import iter_samples, sample_tokens
from kimideploy.workloads.extract_vllm import ExtractionMismatchError, convert
from kimideploy.workloads.runtime import BadInputError, log


class ServerUnavailableError(Exception):
    """The target server did not come back within its startup budget; the pod exits with the
    retry code and resumes from its last checkpoint."""


SERVER_RETURNS = 3
"""How often one sample waits for a dropped server to come back before the pod gives up: a
server that answers /v1/models and then drops every prefill is broken, not reloading."""


class Features(Protocol):
    @property
    def samples(self) -> int: ...

    def sample_id(self, index: int) -> str: ...

    def prefetch(self, indexes: list[int]) -> None: ...

    def load(self, index: int) -> dict[str, Any]: ...

    def lineage(self) -> dict[str, Any]: ...

    def rendering(self) -> dict[str, str]:
        """The chat template and vocabulary the samples were rendered with (their sha256)."""
        ...

    def close(self) -> None: ...


class StoredFeatures:
    def __init__(self, spec: TrainSpec) -> None:
        self.path = spec.hidden_states_dir
        self.record = dataset_record.require(
            Path(spec.hidden_states_dir), "hidden states", spec.data_fingerprint
        )
        self._check_template(spec)
        self.dataset = train_data.open_dataset(Path(spec.hidden_states_dir))
        for note in train_data.check_dataset(self.dataset.manifests, spec):
            log(note)

    def _check_template(self, spec: TrainSpec) -> None:
        """The features are of tokens rendered by a template; the drafter is trained for the
        target that renders with this one."""
        made_with = self.record.get("observed") or {}
        now = template_fingerprint(load_tokenizer(spec.target.path))
        changed = [key for key, value in now.items() if made_with.get(key) != value]
        if changed:
            raise BadInputError(
                f"{self.path}: the features were rendered with another "
                f"{' and '.join(k.removesuffix('_sha256').replace('_', ' ') for k in changed)} "
                f"than the target at {spec.target.path} has now",
                hint="extract again for this revision's tokenizer and template",
            )

    @property
    def samples(self) -> int:
        return self.dataset.samples

    def sample_id(self, index: int) -> str:
        """The conversation's id: extraction names each sample's file by it."""
        return self.dataset.files[index].stem

    def prefetch(self, indexes: list[int]) -> None:
        """Reading a local file is fast enough to do when the batch is built."""

    def load(self, index: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        saved: dict[str, Any] = load_file(str(self.dataset.files[index]))
        return saved

    def lineage(self) -> dict[str, Any]:
        return {
            "mode": "offline",
            "path": self.path,
            "fingerprint": self.record.get("id"),
            **self.dataset.lineage(),
        }

    def rendering(self) -> dict[str, str]:
        observed = self.record.get("observed") or {}
        return {k: str(v) for k, v in observed.items() if k.endswith("_sha256")}

    def close(self) -> None:
        pass


class OnlineFeatures:
    def __init__(self, spec: TrainSpec) -> None:
        if spec.online is None:
            raise BadInputError(
                "train.mode online but the spec names no target server; render the run with "
                "`kimideploy run train` (it adds the server beside the trainer)"
            )
        self.spec, self.online = spec, spec.online
        self.storage = Path(self.online.storage_dir)
        self.limit = spec.max_seq_len + 1  # what the trainer keeps; no prefill beyond it
        expected = [*spec.layers.vllm_ids, spec.target.num_hidden_layers]
        if list(self.online.aux_layer_ids) != expected:
            raise BadInputError(
                f"the target server extracts layers {self.online.aux_layer_ids} (vLLM ids), "
                f"drafter {spec.drafter} needs {expected} (its layers, then the final one); "
                "render the run again with `kimideploy run train`"
            )
        self.record = dataset_record.require(
            Path(self.online.conversations_dir), "conversations", spec.data_fingerprint
        )
        # Only what rendering needs (no usage, finish reasons or prompt indexes per sample).
        self.conversations = sorted(
            (
                {key: s.get(key) for key in RENDERED_FIELDS}
                for s in iter_samples(Path(self.online.conversations_dir))
            ),
            key=lambda s: str(s["id"]),
        )
        if not self.conversations:
            raise BadInputError(
                f"{self.online.conversations_dir}: no generated conversations to train on; run "
                "`kimideploy run datagen` first"
            )
        self.pool = ThreadPoolExecutor(max_workers=self.online.concurrency)
        self.pending: dict[int, Future[dict[str, Any]]] = {}
        self.tokenizer: Any = None

    @property
    def samples(self) -> int:
        return len(self.conversations)

    # -- the server ----------------------------------------------------------------------------
    def connect(self) -> None:
        """Wait for the server (it may be reloading after a restart), then check it serves the
        target: the same served name and weights directory as this run's spec."""

        models = self._wait_for_server()
        target = self.spec.target
        entry = next((m for m in models if m.get("id") == target.served_name), None)
        if entry is None:
            served = ", ".join(str(m.get("id")) for m in models) or "nothing"
            raise BadInputError(
                f"the server at {self.online.endpoint} serves {served}, not {target.served_name}; "
                "the trainer must read the target's own hidden states"
            )
        if entry.get("root") not in (None, target.path):
            raise BadInputError(
                f"the server at {self.online.endpoint} serves {target.served_name} from "
                f"{entry['root']}, this run's target is {target.path} "
                f"({target.repo}@{target.revision[:12]})"
            )
        self.tokenizer = load_tokenizer(target.path)
        log(f"target server ready at {self.online.endpoint}; {self.samples} conversations")

    def _wait_for_server(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.online.server_wait_s
        delay, last = 2.0, ""
        while True:
            try:
                with urllib.request.urlopen(f"{self.online.endpoint}/models", timeout=30) as reply:
                    data: list[dict[str, Any]] = json.loads(reply.read())["data"]
                    return data
            except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
                # A sidecar still loading may hold its port before it speaks HTTP.
                last = str(exc) or type(exc).__name__
            if time.monotonic() >= deadline:
                raise ServerUnavailableError(
                    f"the target server at {self.online.endpoint} did not answer within "
                    f"{self.online.server_wait_s} s ({last}); see the target-server container's log"
                )
            log(f"waiting for the target server at {self.online.endpoint} ({last})")
            time.sleep(delay)
            delay = min(delay * 2, 60.0)

    # -- samples -------------------------------------------------------------------------------
    def sample_id(self, index: int) -> str:
        return str(self.conversations[index]["id"])

    def prefetch(self, indexes: list[int]) -> None:
        for index in indexes:
            if index not in self.pending:
                self.pending[index] = self.pool.submit(self.fetch, index)

    def load(self, index: int) -> dict[str, Any]:
        future = self.pending.pop(index, None) or self.pool.submit(self.fetch, index)
        return future.result()

    def fetch(self, index: int) -> dict[str, Any]:
        """One prefill on the server; its file read, checked and deleted."""
        import torch

        sample = self.conversations[index]
        sample_id = str(sample["id"])
        ids, mask = sample_tokens(self.tokenizer, sample)
        ids, mask = ids[: self.limit], mask[: self.limit]
        reply = self._complete(ids, sample_id)
        path = self._states_path(reply, sample_id)
        try:
            echoed = (reply.get("choices") or [{}])[0].get("prompt_token_ids")
            if echoed is not None and list(echoed) != ids:
                raise ExtractionMismatchError("the server tokenized the prompt differently")
            aux_count = len(self.online.aux_layer_ids) - 1
            return convert(connector_files.read(path), ids, mask, aux_count, dtype=torch.float32)
        except ExtractionMismatchError as exc:
            raise BadInputError(
                f"the server at {self.online.endpoint} returned hidden states that do not belong "
                f"to sample {sample['id']}: {exc}; is it running {self.spec.target.repo} with "
                f"layers {self.online.aux_layer_ids}?"
            ) from exc
        finally:
            connector_files.remove(path)

    def _states_path(self, reply: dict[str, Any], sample_id: str) -> Path:
        params = reply.get("kv_transfer_params") or {}
        raw = params.get("hidden_states_path")
        if not raw:
            raise BadInputError(
                f"the server at {self.online.endpoint} answered sample {sample_id} without "
                "kv_transfer_params.hidden_states_path; it must run with the extract_hidden_states "
                "method and the ExampleHiddenStatesConnector (see the rendered target-server)"
            )
        path = Path(raw)
        # Only ever read and delete inside the scratch directory the pod shares with the server.
        if path.parent.resolve() != self.storage.resolve() or not connector_files.exists(path):
            raise BadInputError(
                f"the server wrote sample {sample_id}'s hidden states to {raw}, which is not a "
                f"file in the shared scratch directory {self.storage}"
            )
        return path

    def _complete(self, ids: list[int], sample_id: str) -> dict[str, Any]:
        body = json.dumps(
            {
                "model": self.spec.target.served_name,
                "prompt": ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "return_token_ids": True,
            }
        ).encode()
        last = ""
        for returned in range(SERVER_RETURNS + 1):
            if returned:
                # A dropped server is restarted by the kubelet and reloads the target (~25
                # minutes for Kimi): wait for it within its startup budget, as at the start.
                log(f"the target server dropped sample {sample_id} ({last}); waiting for it")
                self._wait_for_server()
            for attempt in range(self.online.max_retries + 1):
                if attempt:
                    time.sleep(min(2.0**attempt, 60.0))
                try:
                    return self._post(body)
                except urllib.error.HTTPError as exc:
                    detail = exc.read().decode(errors="replace")[:300]
                    if exc.code < 500:
                        raise BadInputError(
                            f"the server at {self.online.endpoint} refused sample {sample_id} "
                            f"({len(ids)} tokens): HTTP {exc.code} {detail}"
                        ) from exc
                    last = f"HTTP {exc.code} {detail}"
                except (OSError, ValueError) as exc:
                    last = str(exc)
        raise ServerUnavailableError(
            f"the target server at {self.online.endpoint} failed sample {sample_id} after "
            f"coming back {SERVER_RETURNS} times ({last})"
        )

    def _post(self, body: bytes) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.online.endpoint}/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.online.request_timeout_s) as reply:
            answer: dict[str, Any] = json.loads(reply.read())
            return answer

    def lineage(self) -> dict[str, Any]:
        layers = self.spec.layers
        return {
            "mode": "online",
            "conversations": self.online.conversations_dir,
            "fingerprint": self.record.get("id"),
            "samples": self.samples,
            "layer_ids": list(layers.vllm_ids),
            "convention": "vllm",
            "vllm_layer_ids": list(layers.vllm_ids),
            "server_aux_layer_ids": list(self.online.aux_layer_ids),
            "model": {"repo": self.spec.target.repo, "revision": self.spec.target.revision},
        }

    def rendering(self) -> dict[str, str]:
        return template_fingerprint(self.tokenizer or load_tokenizer(self.spec.target.path))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def open_features(spec: TrainSpec) -> Features:
    if spec.mode == "online":
        online = OnlineFeatures(spec)
        online.connect()
        return online
    return StoredFeatures(spec)


__all__ = ["OnlineTrainSpec", "ServerUnavailableError", "open_features"]
