"""The ``retriever_rl`` stage end to end: rollouts against the live server, GRPO updates of the
query encoder, server reloads, logs, checkpoints and resume.

A step: ``Q`` questions, each sent ``G`` times in one sampled ``/retrieve`` request per retrieval
round (one seed per step and round, so query ``i`` of the request draws from stream
``(seed, i)``: reproducible, and the ``G`` copies are independent samples; with
``retriever_queries: decomposition`` one round per sub-question, see :mod:`.state`); the frozen
generator answers each question from its sampled
documents with the project's RAG prompt (greedy, so the reward depends on the retrieval only);
reward = token F1 against the gold answers; one GRPO update (:mod:`.learner`); then the
updated encoder is written to ``<output_dir>/rollout_encoder`` and the server reloads it, so
the next rollouts come from the current policy.

The server must serve ``retriever_index`` and be able to read ``output_dir`` (same machine or
a shared file system): it loads the encoder from there.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mmoa.fileio import atomic_dir, atomic_write_json, atomic_write_text
from mmoa.train.mappo.checkpoint_files import rotate_checkpoints
from mmoa.train.retriever_rl.args import RetrieverRLArguments, parse_retriever_rl_args
from mmoa.train.retriever_rl.learner import NonFiniteLossError, grpo_update
from mmoa.train.stop import StopRequest, install_stop_handlers, restore_handlers

#: LLaMA-Factory's per-step log, read by the web UI's progress bar.
TRAINER_LOG_FILE = "trainer_log.jsonl"
PLOT_KEYS = ["loss", "reward", "answer_f1", "recall", "logprob_gap",
             "grpo/zero_variance_fraction"]
ROLLOUT_ENCODER = "rollout_encoder"
FINAL_ENCODER = "encoder"
#: Seed of the question shuffle of each pass over the data: ``seed * SEED_STRIDE + pass``.
SEED_STRIDE = 1_000_003


class RetrieverRLTrainer:
    """Holds the frozen generator, the trainable query encoder, the optimizer and the log."""

    def __init__(self, args: RetrieverRLArguments, generator: Any | None = None) -> None:
        """``generator``: the answerer of the F1 reward and log instead of a frozen copy of
        ``model_name_or_path`` (the joint MAPPO option passes its live policy's)."""
        from mmoa.retrieval.client import RetrievalClient
        from mmoa.retrieval.encoder import EncoderFolderError
        from mmoa.train.prompt_set import load_mappo_records
        from mmoa.train.retriever_rl.evaluate import (
            GOLD_PASSAGES,
            frozen_generator,
            has_gold_passages,
        )
        from mmoa.train.retriever_rl.policy import (
            DocumentVectors,
            QueryEncoderPolicy,
            policy_config,
        )

        self.args = args
        self.output = Path(args.output_dir)
        self.client = RetrievalClient(args.retriever_url, token=args.retriever_token,
                                      timeout=args.retriever_timeout)
        health = self.client.wait_until_ready(timeout=30)
        self.records = load_mappo_records(args.dataset, args.dataset_dir, args.max_samples)
        unlabelled = [r.id for r in self.records if not has_gold_passages(r)]
        if args.retriever_reward == "recall" and unlabelled:
            raise ValueError(f"retriever_reward: recall needs the {GOLD_PASSAGES} of every "
                             f"question; {len(unlabelled)} of dataset {args.dataset!r} have "
                             f"none (e.g. {unlabelled[0]!r})")
        self.vectors = DocumentVectors(Path(args.retriever_index))
        check_index_identity(Path(args.retriever_index), self.vectors, health, self.client.url)
        torch.manual_seed(args.seed)
        config = policy_config(Path(args.retriever_index), args.retriever_encoder)
        try:
            if args.retriever_encoder:
                from mmoa.retrieval.encoder import check_model_folder

                # the folder the user named: regular files, a sane config.json, the index's
                # dimension (pickle weights are the user's own here, as with --encoder)
                check_model_folder(args.retriever_encoder, untrusted=False,
                                   expected_dim=self.vectors.dim)
            self.policy = QueryEncoderPolicy(
                config, args.retriever_finetuning, args.retriever_lora_rank,
                args.retriever_lora_alpha, args.retriever_lora_dropout, args.lora_targets,
                device="cuda" if torch.cuda.is_available() and not args.use_cpu else "cpu",
                sample_texts=[r.question for r in self.records[:64]])
        except EncoderFolderError as err:  # names the file and the reason
            raise ValueError(f"retriever_encoder: {_one_line(err)}") from err
        except ValueError as err:
            if str(err).startswith("retriever_"):
                raise  # names its key already (retriever_lora_target)
            raise ValueError(f"retriever_encoder {config.model} cannot be loaded: "
                             f"{_one_line(err)}") from err
        except (OSError, RuntimeError, pickle.UnpicklingError, KeyError, TypeError) as err:
            # transformers' and torch's load errors (an unpicklable or truncated checkpoint,
            # missing files) span many lines and are no ValueError: one line, naming the key
            raise ValueError(f"retriever_encoder {config.model} cannot be loaded: "
                             f"{type(err).__name__}: {_one_line(err)}") from err
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(),
                                           lr=args.learning_rate, weight_decay=0.0)
        if generator is None and self.answers_needed:
            generator = frozen_generator(args.model_name_or_path, args.template,
                                         args.retriever_max_new_tokens,
                                         args.retriever_generator_batch_size,
                                         use_cpu=args.use_cpu)
        self.generator = generator if self.answers_needed else None
        self.step = 0
        #: Steps in a row whose update was skipped (non-finite loss or gradient norm).
        self.nonfinite_in_a_row = 0
        #: This run's last checkpoint (or the one it resumed from): what a user has left
        #: when the weights go non-finite.
        self.last_checkpoint: Path | None = None
        self.log_history: list[dict[str, Any]] = []
        self.started = time.monotonic()

    @property
    def answers_needed(self) -> bool:
        """Whether the generator answers: for the F1 reward, or to log the answers' F1."""
        return self.args.retriever_reward == "f1" or self.args.retriever_log_answer_f1

    # ------------------------------------------------------------------------- rollouts

    def questions_of(self, step: int) -> list[Any]:
        """The ``Q`` records of ``step`` (0-based): a seeded shuffle per pass over the data,
        a function of the step alone so that a resumed run sees the same questions."""
        q, n = self.args.retriever_questions_per_step, len(self.records)
        out = []
        for i in range(step * q, step * q + q):
            epoch, position = divmod(i, n)
            order = list(range(n))
            random.Random(self.args.seed * SEED_STRIDE + epoch).shuffle(order)
            out.append(self.records[order[position]])
        return out

    def step_seed(self, step: int, hop: int) -> int:
        """The sampled request's seed of ``step``'s ``hop``-th retrievals: a function of
        (seed, step, hop) alone, so a resumed run draws the same samples."""
        digest = hashlib.sha256(f"{self.args.seed}/{step}/{hop}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1

    def rollout(self, step: int) -> tuple[Any, dict[str, float]]:
        """``G`` rollouts of each of the step's questions: the sampled retrievals (one per
        sub-query; all samples' ``h``-th retrievals in one request), the frozen generator's
        answers from all documents picked, the rewards."""
        from mmoa.metrics import f1_score
        from mmoa.train.retriever_rl.evaluate import (
            answer_documents,
            has_gold_passages,
            support_recall,
        )
        from mmoa.train.retriever_rl.learner import RetrievalGroups
        from mmoa.train.retriever_rl.policy import pool_tensors
        from mmoa.train.retriever_rl.state import retrieval_rounds, sub_queries

        args, g = self.args, self.args.retriever_group_size
        records = self.questions_of(step)
        subs = [sub_queries(r, args.retriever_queries) for r in records for _ in range(g)]

        def sample(states: list[str], hop: int) -> list[dict[str, Any]]:
            results = self.client.retrieve_sampled(
                states, args.retriever_top_k, pool_size=args.retriever_pool_size,
                alpha=args.retriever_alpha, seed=self.step_seed(step, hop))
            for state, result in zip(states, results, strict=True):
                if len(result["picks"]) != args.retriever_top_k:
                    raise ValueError(f"the index returned fewer than retriever_top_k="
                                     f"{args.retriever_top_k} passages for {state!r}")
            return results

        started = time.perf_counter()
        documents, events = retrieval_rounds(subs, args.retriever_history, sample)
        retrieve_s = time.perf_counter() - started
        started = time.perf_counter()
        f1s: list[float] = []
        if self.generator is not None:
            answers = answer_documents(
                self.generator, [records[i // g].question for i in range(len(subs))],
                [[d["contents"] for d in docs.values()] for docs in documents])
            f1s = [f1_score(answer, records[i // g].answers) for i, answer in enumerate(answers)]
        generate_s = time.perf_counter() - started
        recalls = [support_recall(records[i // g], documents[i].values())
                   for i in range(len(subs)) if has_gold_passages(records[i // g])]
        rewards = f1s if args.retriever_reward == "f1" else recalls
        events.sort(key=lambda event: event[0])  # stable: each sample's retrievals in order
        pool_vectors, valid = pool_tensors(self.vectors, [e[2]["pool_rows"] for e in events])
        groups = RetrievalGroups(
            queries=[e[1] for e in events],
            picks=torch.tensor([e[2]["picks"] for e in events], dtype=torch.long),
            pool_vectors=pool_vectors, valid=valid,
            old_logprobs=torch.tensor([e[2]["logprob"] for e in events], dtype=torch.float64),
            rewards=torch.tensor(rewards, dtype=torch.float64).reshape(len(records), g),
            sample_of=torch.tensor([e[0] for e in events], dtype=torch.long))
        stats = {"retrievals_per_sample": len(events) / len(subs),
                 "time/retrieve": retrieve_s, "time/generate": generate_s}
        if f1s:
            stats["answer_f1"] = float(sum(f1s) / len(f1s))
        if recalls:
            stats["recall"] = float(sum(recalls) / len(recalls))
        return groups, stats

    # -------------------------------------------------------------------------- server

    def sync_server(self) -> float:
        """Write the current encoder and make the server embed queries with it."""
        started = time.perf_counter()
        folder = self.output / ROLLOUT_ENCODER
        with atomic_dir(folder) as tmp:
            self.policy.save_encoder(tmp)
        self.client.reload_encoder(str(folder.resolve()))
        return time.perf_counter() - started

    def restore_server(self) -> None:
        """Give the server the index's own encoder back; a failure here is reported, not
        raised, so that it cannot hide the error that ended the run."""
        from mmoa.retrieval.client import RetrieverRequestError, RetrieverUnavailableError

        try:
            self.client.reload_encoder(None)
        except (RetrieverUnavailableError, RetrieverRequestError) as err:
            print(f"[retriever_rl] warning: could not restore the server's own query encoder "
                  f"({err}); it still serves {self.output / ROLLOUT_ENCODER}", file=sys.stderr,
                  flush=True)

    # --------------------------------------------------------------------------- train

    def train(self) -> int | None:
        """The stage's run: ``max_steps`` steps (resumed from ``resume_from_checkpoint``),
        then the final encoder; the server gets its own encoder back even on an error.

        A stop signal ends the run after the step under way, with a checkpoint: the web UI's
        Abort (SIGABRT) still writes the final encoder, as LlamaBoard's stages do; SIGINT or
        SIGTERM does not (the run is unfinished) and the exit code 128 + signal is returned."""
        args = self.args
        self.begin(Path(args.resume_from_checkpoint) if args.resume_from_checkpoint else None)
        bar = tqdm(total=args.max_steps, initial=self.step, desc="retriever_rl", unit="step")
        stop = StopRequest()
        previous = install_stop_handlers(stop)
        stopping = False
        try:
            while self.step < args.max_steps:
                stats = self.train_step()
                stopping = stop.signum is not None  # read once: a signal may come meanwhile
                if self.step % args.save_steps == 0 or self.step == args.max_steps or stopping:
                    checkpoint = self.save_checkpoint()
                bar.update(1)
                bar.set_postfix(reward=f"{stats['reward']:.3f}", loss=f"{stats['loss']:.4f}")
                if stopping:
                    print(f"[retriever_rl] {signal.Signals(stop.signum).name} received: stopped "
                          f"after step {self.step}, saved in {checkpoint}; resume with "
                          f"resume_from_checkpoint={checkpoint}", file=sys.stderr, flush=True)
                    break
        finally:
            restore_handlers(previous)
            bar.close()
            if args.retriever_restore_server_encoder:
                self.restore_server()
        if stopping and stop.signum != signal.SIGABRT:
            return 128 + stop.signum
        self.finish()
        return None

    def begin(self, checkpoint: Path | None) -> None:
        """Restore ``checkpoint`` (or start a fresh log) and make the server serve the
        encoder being trained."""
        self.output.mkdir(parents=True, exist_ok=True)
        if checkpoint is not None:
            self.load_checkpoint(checkpoint)
        else:
            (self.output / TRAINER_LOG_FILE).unlink(missing_ok=True)
        self.sync_server()

    def train_step(self) -> dict[str, float]:
        """One step: rollouts from the served encoder, one GRPO update, the server reloaded
        (every ``retriever_reload_every`` updates, and never after the last one: see
        :meth:`sync_server`), the log line. Returns the step's figures."""
        args = self.args
        step_started = time.perf_counter()
        groups, stats = self.rollout(self.step)
        started = time.perf_counter()
        try:
            stats.update(grpo_update(
                self.policy.embed, self.policy.trainable_parameters(), self.optimizer,
                groups, alpha=args.retriever_alpha, cliprange=args.retriever_cliprange,
                epochs=args.retriever_update_epochs, max_grad_norm=args.max_grad_norm,
                normalise=args.retriever_grpo_normalise))
            stats["nonfinite_skips"] = 0.0
            self.nonfinite_in_a_row = 0
        except NonFiniteLossError as err:
            self.skip_nonfinite_step(err)
            stats.update(loss=float("nan"), nonfinite_skips=1.0)
        self.check_weights(f"step {self.step + 1}: the update left", trainable_only=True)
        stats["time/update"] = time.perf_counter() - started
        self.step += 1
        if self.step % args.retriever_reload_every == 0 and self.step < args.max_steps:
            stats["time/reload"] = self.sync_server()
        stats["time/step"] = time.perf_counter() - step_started
        self.log(stats)
        return stats

    def skip_nonfinite_step(self, err: NonFiniteLossError) -> None:
        """A step whose loss or gradient norm was not finite: nothing was applied; warned
        about and counted, and the ``retriever_max_nonfinite_steps``-th in a row ends the run
        (exit code 1, one line): a lone NaN batch is skipped, a diverged run is not carried
        on."""
        self.nonfinite_in_a_row += 1
        limit = self.args.retriever_max_nonfinite_steps
        where = f"step {self.step + 1}: {err}"
        if self.nonfinite_in_a_row >= limit:
            kept = (f"the last checkpoint, {self.last_checkpoint}, stays as it was"
                    if self.last_checkpoint else "no checkpoint of this run was written")
            raise NonFiniteLossError(f"{where}; {self.nonfinite_in_a_row} steps in a row were "
                                     f"not finite (retriever_max_nonfinite_steps {limit}), "
                                     f"stopping; {kept}")
        print(f"[retriever_rl] warning: {where}; step skipped ({self.nonfinite_in_a_row} in a "
              f"row, retriever_max_nonfinite_steps {limit})", file=sys.stderr, flush=True)

    def check_weights(self, what: str, trainable_only: bool = False) -> None:
        """A ``NonFiniteLossError`` (one line, exit code 1) when a weight of the query encoder
        holds a NaN or an infinity: ``what`` says where (an update, or the save refused)."""
        from mmoa.train.finite import describe, nonfinite_parameters

        bad = nonfinite_parameters(self.policy.model.named_parameters(),
                                   trainable_only=trainable_only)
        if bad:
            kept = (f"the last checkpoint, {self.last_checkpoint}, stays as it was"
                    if self.last_checkpoint else "no checkpoint of this run was written")
            raise NonFiniteLossError(f"{what} NaN or infinite values in {describe(bad)}; "
                                     f"nothing was written; {kept}")

    def finish(self) -> None:
        """The final servable encoder, the state and the plots in ``output_dir`` (refused,
        one line, when a weight is not finite)."""
        self.check_weights(f"refusing to write {self.output / FINAL_ENCODER}:")
        with atomic_dir(self.output / FINAL_ENCODER) as tmp:
            self.policy.save_encoder(tmp)
        atomic_write_json(self.output / "trainer_state.json", self.state())
        if self.args.plot_loss:
            from mmoa.train.plots import save_training_plots

            save_training_plots(self.output, PLOT_KEYS)

    def log(self, stats: dict[str, float]) -> None:
        entry = {"step": self.step, "learning_rate": self.args.learning_rate,
                 **{k: round(v, 6) for k, v in stats.items()}}
        self.log_history.append(entry)
        if self.step % self.args.logging_steps and self.step != self.args.max_steps:
            return
        elapsed = time.monotonic() - self.started
        total = self.args.max_steps
        line = {"current_steps": self.step, "total_steps": total, "loss": entry["loss"],
                "reward": entry["reward"], "lr": self.args.learning_rate,
                "epoch": round(self.step * self.args.retriever_questions_per_step
                               / len(self.records), 4),
                "percentage": round(self.step / total * 100, 2),
                "elapsed_time": _hms(elapsed),
                "remaining_time": _hms(elapsed / max(self.step, 1) * (total - self.step)),
                **{k: v for k, v in entry.items() if k not in ("step", "learning_rate")}}
        with (self.output / TRAINER_LOG_FILE).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
        summary = (f"[retriever_rl] step {self.step}/{total}: reward {entry['reward']:.3f}, "
                   f"recall {entry.get('recall', float('nan')):.3f}, loss {entry['loss']:.4f}, "
                   f"logprob gap {entry.get('logprob_gap', float('nan')):.2e}, "
                   f"{entry['time/step']:.1f} s")
        print(summary, file=sys.stderr, flush=True)
        from mmoa.train.mappo.log import in_web_ui

        if in_web_ui():  # LlamaBoard's log box shows the run's running_log.txt
            from llamafactory.extras.constants import RUNNING_LOG

            with (self.output / RUNNING_LOG).open("a", encoding="utf-8") as handle:
                handle.write(summary + "\n")

    # --------------------------------------------------------------------- checkpoints

    def state(self) -> dict[str, Any]:
        return {"global_step": self.step, "max_steps": self.args.max_steps,
                "log_history": self.log_history, "stage": "retriever_rl",
                "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "retriever_finetuning": self.args.retriever_finetuning}

    def save_checkpoint(self) -> Path:
        """``checkpoint-<step>/`` in ``output_dir``, written whole or not at all; then the
        oldest beyond ``save_total_limit`` are removed, as MAPPO's saves do."""
        folder = self.output / f"checkpoint-{self.step}"
        self.check_weights(f"refusing to write {folder}:")
        with atomic_dir(folder) as tmp:
            self.write_checkpoint(tmp)
        self.last_checkpoint = folder
        for old in rotate_checkpoints(self.output, self.args.save_total_limit):
            print(f"[retriever_rl] save_total_limit {self.args.save_total_limit}: removed {old}",
                  file=sys.stderr, flush=True)
        return folder

    def write_checkpoint(self, folder: Path) -> None:
        """Into ``folder``: ``encoder/`` (servable), ``trainable.pt`` and ``optimizer.pt``
        (resume), ``trainer_state.json`` and the log so far."""
        folder.mkdir(parents=True, exist_ok=True)
        self.policy.save_encoder(folder / FINAL_ENCODER)
        torch.save(self.policy.trainable_state(), folder / "trainable.pt")
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
        atomic_write_json(folder / "trainer_state.json", self.state())
        log = self.output / TRAINER_LOG_FILE
        atomic_write_text(folder / TRAINER_LOG_FILE,
                          log.read_text(encoding="utf-8") if log.is_file() else "")

    def load_checkpoint(self, folder: Path) -> None:
        state_file = folder / "trainer_state.json"
        if not state_file.is_file():
            raise FileNotFoundError(f"resume_from_checkpoint: {state_file} not found; expected a "
                                    f"checkpoint-<step> folder of a retriever_rl run")
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if state.get("stage") != "retriever_rl" \
                or state.get("retriever_finetuning") != self.args.retriever_finetuning:
            raise ValueError(f"resume_from_checkpoint: {folder} was written by stage "
                             f"{state.get('stage')!r} with retriever_finetuning "
                             f"{state.get('retriever_finetuning')!r}; this run uses "
                             f"retriever_rl with {self.args.retriever_finetuning!r}")
        self.policy.load_trainable_state(torch.load(folder / "trainable.pt", weights_only=True))
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        self.step = int(state["global_step"])
        self.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))  # absent before #72
        self.last_checkpoint = folder
        self.log_history = list(state["log_history"])
        atomic_write_text(self.output / TRAINER_LOG_FILE,
                          (folder / TRAINER_LOG_FILE).read_text(encoding="utf-8"))


def _one_line(err: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an error's message, at most ``limit`` characters."""
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), repr(err))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def check_index_identity(index_dir: Path, vectors: Any, health: dict[str, Any],
                         url: str) -> None:
    """The server at ``url`` must serve the index folder whose passage vectors the trainer
    scores against: same size and dimension, and (where the server reports them) the same
    corpus checksum and ``index.faiss`` sha256 as ``meta.json`` records. Size and dimension
    alone let a run train against another 300-passage corpus (exit 0, a log-probability gap of
    7 and a clip ratio of 0.002): a ``ValueError`` in one line instead."""
    from mmoa.retrieval.index import INDEX_FILE, META_FILE, IndexLoadError, IndexMeta

    try:
        meta = IndexMeta.read(index_dir / META_FILE)
    except (IndexLoadError, OSError) as err:
        raise ValueError(f"retriever_index {index_dir}: {_one_line(err)}") from err
    problems = []
    if health.get("corpus_size") != vectors.size or health.get("dim") != vectors.dim:
        problems.append(f"{vectors.size} {vectors.dim}-d vectors here, "
                        f"{health.get('corpus_size')} {health.get('dim')}-d ones there")
    served_corpus, served_index = health.get("corpus_checksum"), health.get("index_checksum")
    if served_corpus is not None and served_corpus != meta.corpus_checksum:
        problems.append(f"corpus checksum {meta.corpus_checksum[:12]}… here, "
                        f"{str(served_corpus)[:12]}… there")
    recorded = meta.files.get(INDEX_FILE)
    if recorded and served_index and served_index != recorded:
        problems.append(f"{INDEX_FILE} sha256 {recorded[:12]}… here, "
                        f"{str(served_index)[:12]}… there")
    if problems:
        raise ValueError(f"retriever_index {index_dir} is another index than the one the server "
                         f"at {url} serves ({'; '.join(problems)}): start the server on "
                         f"retriever_index, or point retriever_index at the server's index")
    if served_corpus is None:
        print(f"[retriever_rl] warning: the server at {url} does not report its index's "
              f"checksums (an older server): only the passage count and dimension were "
              f"compared with retriever_index", file=sys.stderr, flush=True)


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run_retriever_rl(config: dict[str, Any]) -> int | None:
    """Train; ``None`` when the run finished (or was aborted from the web UI), else the exit
    code of the signal that stopped it."""
    return RetrieverRLTrainer(parse_retriever_rl_args(config)).train()


def run_retriever_rl_from_config(config: dict[str, Any]) -> int:
    """``mmoa-cli train`` with ``stage: retriever_rl``: errors as one line on stderr, code 1."""
    from mmoa.retrieval.client import RetrieverRequestError, RetrieverUnavailableError

    try:
        code = run_retriever_rl(config)
    except (RetrieverUnavailableError, RetrieverRequestError, ValueError, KeyError,
            FileNotFoundError) as err:
        print(f"[retriever_rl] error: {err}", file=sys.stderr, flush=True)
        return 1
    return code or 0
