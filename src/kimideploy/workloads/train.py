"""train: an EAGLE-3 drafter with the pinned speculators release, on the target's hidden states:
stored by `run extract` (offline) or computed on request by a vLLM server in the pod (online,
see train_features.py).

The model, its loss and its per-position accuracy are speculators' own (Eagle3DraftModel built the
way `speculators train` builds it); the loop around it is ours, because it must keep the promises
of every workload here: refuse wrong features before spending GPU time, checkpoint atomically every
N steps and at each epoch end, resume a restarted pod at the step it stopped (same data order,
same optimizer state), drain on SIGTERM (exit 75), and write a drafter vLLM loads as it is, with a
lineage file that says what it was trained on.

torchrun starts one process per GPU; several nodes get their rank from the Indexed Job and meet at
index 0 through the headless Service (see plan/jobs.py). One process (RANK unset) runs on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kimideploy.config.fingerprints import fingerprint_id
from kimideploy.config.specs import NetworkCheck, TrainSpec
from kimideploy.workloads import (
    allreduce_probe,
    dataset_record,
    heldout,
    replay_sample,
    train_checkpoints,
    train_data,
    train_loader,
)
from kimideploy.workloads.runtime import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInputError,
    Stopper,
    atomic_write,
    emit,
    log,
)
from kimideploy.workloads.train_checkpoints import STATE_FILE
from kimideploy.workloads.train_features import Features, ServerUnavailableError, open_features
from kimideploy.workloads.train_schedule import build_scheduler
from kimideploy.workloads.vocab import load_vocab_maps

LINEAGE_FILE = "kimideploy-lineage.json"
# PyTorch's own default for NCCL: long enough for a checkpoint write on rank 0, short enough
# that a hung rank does not hold a whole cluster for an hour.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass
class Position:
    """Where training stands; a checkpoint stores it and a resumed run starts from it."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def _ranks() -> Ranks:
    return Ranks(
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def run(spec: TrainSpec) -> int:
    ranks = _ranks()
    try:
        features = open_features(spec)
    except ServerUnavailableError as exc:
        # A server that never loaded is counted against the Job's retries (exit 1); one that
        # loaded and dropped later is waited for, then retried without counting (below).
        log(f"error: {exc}")
        return EXIT_FAILED
    try:
        ids = [features.sample_id(i) for i in range(features.samples)]
        split = heldout.split_samples(ids, spec.held_out_fraction, spec.held_out_max_samples)
        steps = train_data.steps_per_epoch(len(split.train), ranks.world, spec.batch_size)
        if steps == 0:
            source = "extract" if spec.mode == "offline" else "generate"
            raise BadInputError(
                f"{len(split.train)} training samples ({len(split.held_out)} more held out) "
                f"cannot fill one batch of {spec.batch_size} on each of {ranks.world} ranks; "
                f"lower train.batch_size or {source} more samples"
            )
        _same_conversations(spec)
        d2t, t2d = load_vocab_maps(Path(spec.vocab_dir), spec.target.vocab_size)
        if len(d2t) != spec.draft_vocab_size:
            raise BadInputError(
                f"the vocab maps in {spec.vocab_dir} have {len(d2t)} draft tokens, drafter "
                f"{spec.drafter} wants {spec.draft_vocab_size}; run `kimideploy run vocab` again"
            )
        return Trainer(
            spec, features, ranks, d2t, t2d=t2d, split=split, steps_per_epoch=steps
        ).train()
    except ServerUnavailableError as exc:
        log(f"error: {exc}")
        log(
            f"exit {EXIT_INTERRUPTED}: the Job starts this pod again, which waits for its server "
            "and resumes from the last checkpoint"
        )
        return EXIT_INTERRUPTED
    except PeerRankStoppedError as exc:
        log(f"error: {exc}")
        return EXIT_INTERRUPTED
    finally:
        features.close()


class PeerRankStoppedError(Exception):
    """A collective failed: another rank left (its server gone for good, its node lost). Every
    rank exits with the retry code, the Job starts them all again, and they resume together from
    the last checkpoint."""


def _same_conversations(spec: TrainSpec) -> None:
    """The vocab maps must come from the conversations the features (or the online run) use."""
    vocab = dataset_record.require(Path(spec.vocab_dir), "vocab maps", {})
    made_from = (vocab.get("fields") or {}).get("conversations")
    wanted = spec.data_fingerprint.get("conversations") or fingerprint_id(spec.data_fingerprint)
    if spec.data_fingerprint and made_from != wanted:
        raise BadInputError(
            f"{spec.vocab_dir}: the vocab maps were counted on conversations {made_from}, this run "
            f"trains on conversations {wanted}",
            hint="run `kimideploy run vocab` for these conversations first",
        )


class Trainer:
    def __init__(
        self,
        spec: TrainSpec,
        features: Features,
        ranks: Ranks,
        d2t: Any,
        *,
        t2d: Any,
        split: heldout.Split,
        steps_per_epoch: int,
    ) -> None:
        import torch

        self.spec, self.features, self.ranks, self.split = spec, features, ranks, split
        self.group: Any = None
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = steps_per_epoch * spec.epochs
        self.device = (
            torch.device("cuda", ranks.local_rank)
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        if ranks.world > 1:
            import torch.distributed as dist

            if torch.cuda.is_available():
                torch.cuda.set_device(self.device)
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            # Online, each rank joins only once its node's server has loaded, and nodes load at
            # different speeds: joining may take up to the servers' budget. Training itself runs
            # on a group with the usual timeout, so a hung collective is still caught quickly.
            join = COLLECTIVE_TIMEOUT + (
                timedelta(seconds=spec.online.server_wait_s) if spec.online else timedelta()
            )
            dist.init_process_group(backend, timeout=join)
            # Online, a rank whose server dropped waits for it to reload (up to its budget)
            # before its next collective; the others wait for it rather than time out.
            self.group = dist.new_group(backend=backend, timeout=join)
            if spec.network_check is not None:
                self._check_network(spec.network_check)
        torch.manual_seed(spec.seed)
        # fp32 master weights whatever the base drafter was saved in; bf16 comes from autocast.
        self.model = build_model(spec, d2t, t2d).to(self.device, dtype=torch.float32)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=spec.lr, weight_decay=spec.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, self.total_steps, spec)
        self.position = Position()
        self.loss_config = _loss_config(spec.loss_implementation)
        self.stopper = Stopper()
        self.best: dict[str, Any] | None = None
        self.head: heldout.TargetHead | None = None
        self.last_step_s = 0.0

    def _check_network(self, check: NetworkCheck) -> None:
        """An all-reduce across every rank before the first step: its bus bandwidth and the
        transport NCCL took on each rank; sockets or too little bandwidth stop the run here,
        named, instead of training for days over one TCP stream per rank."""
        import torch.distributed as dist

        seconds, size = allreduce_probe.measure(self.group, self.device, check.bytes, 5)
        bus = allreduce_probe.bus_bandwidth_gbps(size, seconds, self.ranks.world)
        transports: list[str | None] = [None] * self.ranks.world
        dist.all_gather_object(transports, allreduce_probe.own_transport(), group=self.group)
        if self.ranks.leader:
            emit(
                {
                    "event": "network",
                    "stage": "train",
                    "ranks": self.ranks.world,
                    "bus_gbps": round(bus, 2),
                    "transports": transports,
                }
            )
        problem = allreduce_probe.verdict(transports, bus, check.min_bus_gbps)
        if problem is not None:
            raise BadInputError(problem)
        log(f"all-reduce across {self.ranks.world} ranks: {bus:.1f} GB/s bus bandwidth")

    # -- the loop ------------------------------------------------------------------------------
    def train(self) -> int:
        import torch.distributed as dist

        try:
            return self._train()
        except dist.DistError as exc:
            raise PeerRankStoppedError(
                f"a collective with the other ranks failed ({type(exc).__name__}: "
                f"{str(exc)[:300]}); exit {EXIT_INTERRUPTED}: every rank is started again and "
                "resumes from the last checkpoint"
            ) from exc

    def _train(self) -> int:
        import torch

        self._resume()
        model = self.model
        if self.ranks.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(self.model, process_group=self.group)
        started, start_step, start_tokens = time.monotonic(), self.position.step, 0
        last: dict[str, Any] = {}
        while self.position.epoch < self.spec.epochs:
            order = train_data.epoch_order(
                self.split.train,
                self.spec.seed,
                self.position.epoch,
                self.ranks.rank,
                world=self.ranks.world,
            )
            batches = list(train_data.batches(order, self.spec.batch_size))
            todo = batches[self.position.step_in_epoch :]
            packed = train_loader.packed_batches(
                self.features,
                todo,
                max_seq_len=self.spec.max_seq_len,
                dtype=heldout.feature_dtype(self.spec.precision),
                device=self.device,
                workers=self.spec.loader_workers,
            )
            for batch in packed:
                step_started = time.perf_counter()
                model.train()
                with heldout.autocast(self.device, self.spec.precision):
                    _, loss, metrics = model(
                        **batch,
                        ttt_steps=self.spec.ttt_steps,
                        ttt_step_loss_decay=self.spec.ttt_step_loss_decay,
                        loss_config=self.loss_config,
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                lr = self.scheduler.get_last_lr()[0]
                self.optimizer.step()
                self.scheduler.step()
                tokens = int(batch["input_ids"].shape[1]) * self.ranks.world
                self.position.step += 1
                self.position.step_in_epoch += 1
                self.position.tokens += tokens
                start_tokens += tokens
                loss_value = float(loss.detach())  # waits for the step on a GPU
                self.last_step_s = time.perf_counter() - step_started
                last = self._report(loss_value, lr, metrics, started, start_step, start_tokens)
                if self.position.step % self.spec.checkpoint_every_steps == 0:
                    self._checkpoint(last)
                if self._should_stop():
                    packed.close()  # stops the loader's workers before the checkpoint
                    self._checkpoint(last)
                    log(f"stopped at step {self.position.step}; a restarted pod resumes there")
                    return EXIT_INTERRUPTED
            self.position.epoch += 1
            self.position.step_in_epoch = 0
            self._checkpoint(last)
        if self.ranks.leader:
            self._write_drafter(last)
        self._barrier()
        return EXIT_OK

    def _batch(self, sample_ids: list[int]) -> dict[str, Any]:
        """Samples packed into one sequence (document ids keep attention within a sample)."""
        saved = [self.features.load(index) for index in sample_ids]
        dtype = heldout.feature_dtype(self.spec.precision)
        multiple = heldout.pack_multiple(self.device)
        return heldout.pack(saved, self.spec.max_seq_len, self.device, dtype, multiple=multiple)

    def _report(
        self,
        loss: float,
        lr: float,
        metrics: dict[str, Any],
        started: float,
        start_step: int,
        start_tokens: int,
    ) -> dict[str, Any]:
        accuracy = per_position_accuracy(metrics, self.spec.ttt_steps)
        elapsed = max(time.monotonic() - started, 1e-6)
        rate = (self.position.step - start_step) / elapsed
        figures = {
            "step": self.position.step,
            "epoch": self.position.epoch + 1,
            "loss": round(loss, 6),
            "lr": float(f"{lr:.6g}"),
            "accuracy_per_position": [round(a, 4) for a in accuracy],
            "tokens_per_s": round(start_tokens / elapsed, 1),
            # The last step alone (forward, backward, optimizer; not the wait for its batch):
            # comparable across precisions and data sources where the rate above is not.
            "step_s": round(self.last_step_s, 4),
        }
        if self.best is not None:
            figures["held_out_length"] = self.best["latest_length"]
        if self.ranks.leader:
            remaining = self.total_steps - self.position.step
            emit(
                {
                    "event": "progress",
                    "stage": "train",
                    "done": self.position.step,
                    "total": self.total_steps,
                    "unit": "steps",
                    "rate": round(rate, 4),
                    "eta_s": round(remaining / rate, 1) if rate > 0 else None,
                    **figures,
                }
            )
        return figures

    def _should_stop(self) -> bool:
        """Every rank stops at the same step: a SIGTERM on any of them stops all."""
        if self.ranks.world == 1:
            return self.stopper.stopping
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.stopper.stopping else 0.0], device=self.device)
        dist.all_reduce(flag, group=self.group)
        return bool(flag.item() > 0)

    def _barrier(self) -> None:
        if self.ranks.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    # -- held-out judgement ----------------------------------------------------------------------
    def _judge(self) -> dict[str, Any] | None:
        """The held-out figures of the model as it is now; every rank judges its share of the
        held-out samples and the draft counts are summed (they add up across samples)."""
        import torch

        mine = self.split.held_out[self.ranks.rank :: self.ranks.world]
        if not self.split.held_out:
            return None
        if self.head is None:
            eps = float(self.model.config.transformer_layer_config.rms_norm_eps)
            self.head = heldout.TargetHead(self.spec.target.path, eps, self.device)
        depth = self.spec.judged_depth
        per_turn: list[list[int]] = []
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), heldout.autocast(self.device, self.spec.precision):
            for start in range(0, len(mine), self.spec.batch_size):
                ids = mine[start : start + self.spec.batch_size]
                self.features.prefetch(ids)
                per_turn += heldout.judge_batch(self.model, self.head, self._batch(ids), depth)
        self.model.train(was_training)
        if self.ranks.world > 1:
            per_turn = self._all_turns(per_turn)
        walks = heldout.judge_turns(per_turn, depth)
        return heldout.figures(walks, len(self.split.held_out), per_turn)

    def _all_turns(self, mine: list[list[int]]) -> list[list[int]]:
        """Every rank's judged turns, in rank order: the interval resamples turns, so the
        counts of each turn travel, not only their sums."""
        import torch.distributed as dist

        gathered: list[list[list[int]] | None] = [None] * self.ranks.world
        dist.all_gather_object(gathered, mine, group=self.group)
        return [turn for part in gathered for turn in (part or [])]

    def _consider(self, judged: dict[str, Any] | None) -> None:
        """Keep track of the best checkpoint by held-out acceptance length at the serving k
        (the earliest of equals: fewer steps, same prediction)."""
        if judged is None:
            return
        k = str(self.spec.num_speculative_tokens)
        length = float(judged["mean_acceptance_length"][k])
        best = self.best
        if best is None or length > best["length"]:
            self.best = {"step": self.position.step, "length": length, "k": int(k)}
        assert self.best is not None
        self.best["latest_length"] = length
        emit(
            {
                "event": "evaluation",
                "stage": "train",
                "step": self.position.step,
                "held_out": judged,
                "best_step": self.best["step"],
                "best_length": self.best["length"],
            }
        )
        log(
            f"step {self.position.step}: held-out mean acceptance length "
            + ", ".join(f"k={kk} {v}" for kk, v in judged["mean_acceptance_length"].items())
            + f" (best at k={k}: {self.best['length']} at step {self.best['step']})"
        )

    # -- checkpoints ---------------------------------------------------------------------------
    def _checkpoint(self, figures: dict[str, Any]) -> None:
        """Judged on the held-out samples, then written by rank 0 (step-N/, state.json last)."""
        root = Path(self.spec.checkpoint_dir)
        judged = None
        if not (train_checkpoints.step_dir(root, self.position.step) / STATE_FILE).is_file():
            judged = self._judge()
            self._consider(judged)
        if self.ranks.leader:
            weights = self.model.state_dict().items()
            record = {
                **self.position.__dict__,
                "run_id": self.spec.run_id,
                "metrics": figures,
                "held_out": judged,
                "best": self.best,
                "split": self.split.record,
                "world": self.ranks.world,
                "dataset": self.features.lineage().get("fingerprint"),
            }
            final = train_checkpoints.write(
                root,
                self.position.step,
                {k: v.detach().cpu().contiguous() for k, v in weights},
                self.optimizer,
                self.scheduler,
                record,
            )
            best = self.best["step"] if self.best else None
            keep = {train_checkpoints.step_dir(root, best).name} if best is not None else set()
            train_checkpoints.prune(root, keep)
            emit(
                {
                    "event": "checkpoint",
                    "stage": "train",
                    "step": self.position.step,
                    "path": str(final),
                    "held_out_length": (self.best or {}).get("latest_length"),
                }
            )
        self._barrier()

    def _resume(self) -> None:
        found = train_checkpoints.latest(Path(self.spec.checkpoint_dir))
        if found is None and self.spec.resume_dir:
            found = train_checkpoints.latest(Path(self.spec.resume_dir))
        if found is None:
            log(f"starting at step 0 ({self.total_steps} steps, {self.spec.epochs} epochs)")
            return
        state = train_checkpoints.state(found)
        dataset = self.features.lineage().get("fingerprint")
        if state.get("dataset") and dataset and state["dataset"] != dataset:
            raise BadInputError(
                f"{found} was trained on dataset {state['dataset']}, this run trains on {dataset}: "
                "its step and data order belong to the other dataset",
                hint="start a new run (without train.resume_run), or train on that dataset",
            )
        recorded = (state.get("split") or {}).get("held_out_ids_sha256")
        if recorded and recorded != self.split.record["held_out_ids_sha256"]:
            raise BadInputError(
                f"{found} held out other samples ({state['split']['held_out_samples']} at "
                f"fraction {state['split']['fraction']}) than this run would "
                f"({self.split.record['held_out_samples']} at {self.spec.held_out_fraction}): "
                "resuming would train on samples it was judged on",
                hint="keep train.held_out_fraction as it was, or start a new run",
            )
        train_checkpoints.restore(
            found, self.model, self.optimizer, self.scheduler, device=self.device
        )
        self.position = Position(
            state["step"], state["epoch"], state["step_in_epoch"], state["tokens"]
        )
        if self.scheduler.last_epoch != self.position.step:  # written before schedules existed
            self.scheduler.last_epoch = self.position.step - 1
            self.scheduler.step()
        self.best = state.get("best")
        log(f"resuming from {found} at step {self.position.step} of {self.total_steps}")
        if self.ranks.leader:
            emit(
                {
                    "event": "resumed",
                    "stage": "train",
                    "step": self.position.step,
                    "epoch": self.position.epoch + 1,
                    "from": str(found),
                }
            )

    # -- the drafter ---------------------------------------------------------------------------
    def _select(self) -> dict[str, Any]:
        """Load the best checkpoint's weights when it is not the last step; say which and why."""
        last = self.position.step
        if self.best is None:
            return {
                "step": last,
                "reason": "the last step: no held-out samples to judge on "
                f"(train.held_out_fraction {self.spec.held_out_fraction})",
            }
        k, step, length = self.best["k"], self.best["step"], self.best["length"]
        latest = self.best.get("latest_length")
        if step == last:
            return {
                "step": step,
                "held_out_length": length,
                "reason": f"the last step has the best held-out mean acceptance length at k={k} "
                f"({length})",
            }
        path = train_checkpoints.step_dir(Path(self.spec.checkpoint_dir), step)
        train_checkpoints.load_weights(path, self.model)
        reason = (
            f"step {step} has the best held-out mean acceptance length at k={k} ({length}); "
            f"the last step ({last}) had {latest}"
        )
        log(f"writing the drafter of {reason}")
        return {"step": step, "held_out_length": length, "reason": reason}

    def _held_out_of(self, step: int) -> dict[str, Any] | None:
        path = train_checkpoints.step_dir(Path(self.spec.checkpoint_dir), step)
        if not (path / STATE_FILE).is_file():
            return None
        judged: dict[str, Any] | None = train_checkpoints.state(path).get("held_out")
        return judged

    def _write_drafter(self, figures: dict[str, Any]) -> None:
        selected = self._select()
        held_out = self._held_out_of(selected["step"])
        out = Path(self.spec.output_dir)
        tmp = out.with_name(f".{out.name}.tmp-{self.spec.run_id}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(str(tmp))
        config_path = tmp / "config.json"
        config = json.loads(config_path.read_text())
        # vLLM reads these at the top level; speculators writes them there, made certain here.
        config["eagle_aux_hidden_state_layer_ids"] = list(self.spec.layers.vllm_ids)
        config["draft_vocab_size"] = self.spec.draft_vocab_size
        methods = config["speculators_config"]["proposal_methods"]
        methods[0]["speculative_tokens"] = self.spec.num_speculative_tokens
        atomic_write(config_path, json.dumps(config, indent=2, sort_keys=True).encode())
        lineage = self._lineage(figures, selected, held_out)
        lineage["replay_sample"] = self._write_replay_sample(tmp)
        atomic_write(tmp / LINEAGE_FILE, json.dumps(lineage, indent=2).encode())
        if out.exists():  # never overwrite a drafter: the previous one moves aside
            aside = out.with_name(f"{out.name}.previous-{datetime.now(UTC):%Y%m%dT%H%M%S}")
            out.rename(aside)
            log(f"moved the previous {out} to {aside}")
        tmp.rename(out)
        emit(
            {
                "event": "result",
                "stage": "train",
                "drafter": self.spec.drafter,
                "output_dir": str(out),
                "steps": self.position.step,
                "selected": selected,
                "held_out": held_out,
                "num_speculative_tokens": self.spec.num_speculative_tokens,
                **figures,
            }
        )
        log(f"wrote drafter {self.spec.drafter} (step {selected['step']}) to {out}")

    def _write_replay_sample(self, folder: Path) -> dict[str, Any] | None:
        """The judged held-out conversations, with the token ids training rendered them to, for
        `drafter doctor` to replay on the serving engine wherever the drafter goes."""
        where = self.spec.conversations_dir or (
            self.spec.online.conversations_dir if self.spec.online else None
        )
        if not self.split.held_out or where is None:
            return None
        self.features.prefetch(self.split.held_out)
        rendered = {}
        for index in self.split.held_out:
            saved = self.features.load(index)
            rendered[self.features.sample_id(index)] = (
                [int(i) for i in saved["input_ids"].tolist()],
                [int(m) for m in saved["loss_mask"].tolist()],
            )
        rows = replay_sample.write(folder, Path(where), rendered)
        log(f"replay sample: {rows} held-out conversations written beside the drafter")
        return {
            "file": replay_sample.REPLAY_SAMPLE_FILE,
            "conversations": rows,
            "rendering": self.features.rendering(),
        }

    def _lineage(
        self, figures: dict[str, Any], selected: dict[str, Any], held_out: dict[str, Any] | None
    ) -> dict[str, Any]:
        from importlib.metadata import version

        spec_json = self.spec.model_dump_json()
        return {
            "kind": "kimideploy.drafter-lineage.v1",
            "drafter": self.spec.drafter,
            "run_id": self.spec.run_id,
            "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "trained_for": self.spec.target.repo,
            "trained_for_revision": self.spec.target.revision,
            "eagle_aux_hidden_state_layer_ids": list(self.spec.layers.vllm_ids),
            "layer_id_convention": "vllm",
            "written_as": {"ids": self.spec.layers.ids, "convention": self.spec.layers.convention},
            "draft_vocab_size": self.spec.draft_vocab_size,
            "num_speculative_tokens": self.spec.num_speculative_tokens,
            "ttt_steps": self.spec.ttt_steps,
            "base_drafter": self.spec.base_drafter_path,
            "dataset": {**self.features.lineage(), "held_out": self.split.record},
            "vocab": self.spec.vocab_dir,
            "config_sha256": hashlib.sha256(spec_json.encode()).hexdigest(),
            "speculators_version": version("speculators"),
            "world_size": self.ranks.world,
            "selected_checkpoint": selected,
            "held_out": held_out,
            "metrics": {**figures, "epochs": self.spec.epochs, "tokens": self.position.tokens},
        }


def latest_checkpoint(root: Path) -> Path | None:
    """The newest step-N directory whose state.json was written (the last thing written)."""
    return train_checkpoints.latest(root)


def per_position_accuracy(metrics: dict[str, Any], positions: int) -> list[float]:
    """speculators' conditional accuracy per draft position: correct given all earlier correct,
    the training-time counterpart of vLLM's per-position acceptance."""
    out = []
    for i in range(positions):
        total = float(metrics.get(f"cond_acc_{i}_total", 0))
        out.append(float(metrics.get(f"cond_acc_{i}_sum", 0)) / total if total else 0.0)
    return out


def _loss_config(implementation: str) -> Any:
    """speculators' KL loss; its fused kernels need a GPU (and a compiler that takes them)."""
    import torch
    from speculators.losses import resolve_loss_config

    fused = implementation == "fused" and torch.cuda.is_available()
    return resolve_loss_config("kl_div", "fused" if fused else "eager")


def build_model(spec: TrainSpec, d2t: Any, t2d: Any) -> Any:
    """From a base drafter (fine-tuning) or from scratch, the way `speculators train` builds one."""
    import torch
    from speculators.models.eagle3.core import Eagle3DraftModel

    attention = "simple_flex_attention" if torch.cuda.is_available() else "eager"
    if spec.base_drafter_path:
        base = Path(spec.base_drafter_path)
        try:
            model = heldout.load_drafter(str(base), attention, spec.target.path)
        except (OSError, ValueError, KeyError) as exc:
            raise BadInputError(
                f"base drafter {base} is not a speculators EAGLE-3 checkpoint ({exc}); convert it "
                "with `speculators convert` or train from scratch (train.base_drafter: null)"
            ) from exc
        written = list(model.config.eagle_aux_hidden_state_layer_ids or [])
        if written != list(spec.layers.vllm_ids):
            raise BadInputError(
                f"base drafter {base} reads layers {written} (vLLM's convention), the dataset and "
                f"drafter {spec.drafter} use {spec.layers.vllm_ids}; fine-tuning cannot change them"
            )
        if model.config.draft_vocab_size != spec.draft_vocab_size:
            raise BadInputError(
                f"base drafter {base} has a draft vocabulary of {model.config.draft_vocab_size}, "
                f"drafter {spec.drafter} wants {spec.draft_vocab_size}"
            )
        return model
    from speculators.train.cli import create_transformer_layer_config

    layer_config = create_transformer_layer_config(
        spec.target.path, spec.draft_layers, "llama", None, 0, list(range(spec.draft_layers))
    )
    return Eagle3DraftModel.from_training_args(
        layer_config,
        t2d=t2d,
        d2t=d2t,
        target_layer_ids=list(spec.layers.vllm_ids),
        draft_vocab_size=spec.draft_vocab_size,
        norm_before_residual=True,
        ttt_steps=spec.ttt_steps,
        verifier_name_or_path=spec.target.path,
        draft_attn_impl=attention,
    )


__all__ = ["EXIT_BAD_INPUT", "run"]
