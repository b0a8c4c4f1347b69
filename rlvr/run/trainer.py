"""A whole run as one object: `Trainer.build(settings)` sets it up, `fit()` runs its phases.

    trainer = Trainer.build(experiment.check(cfg))
    summary = trainer.fit()

`fit` reads as the run: warm start (SFT, or the finished one `sft.init_from` names), evaluate,
then each RL step (`rollout.rl_step`), evaluate if due, log (`outcome.StepLog`), export if
due, checkpoint if due; at the end evaluate, export and summarise. Each phase is timed under
the name it has here: the step's row carries `time_rl_step` and `time_evaluate`, summary.json
`phases_s` the total of every phase in this invocation.

Rerunning the same command resumes: a finished SFT is reloaded from `sft/model/`, RL from its
last orbax checkpoint with the method's own state (`Resume`), finished evaluations from
`progress.json`. Nothing here depends on which method runs (`methods.make`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any

import jax

from rlvr import envs, learner, methods, rollout
from rlvr import model as model_lib
from rlvr.parallel import distributed
from rlvr.rewards import preflight
from rlvr.rewards.verifiers import Agreed, open_verifier
from rlvr.rollout import buffer_file
from rlvr.run import checkpoint, evaluation, experiment, interrupt, outcome, sft
from rlvr.run import workdir as workdir_lib
from rlvr.run.workdir import Run
from rlvr.sampling import build as sampler_build


@dataclasses.dataclass(frozen=True)
class Resume:
  """Where a rerun picks up: the RL steps done, the method's state after them, and the step
  of the buffer built ahead for the next one (rl.loop.max_staleness=1; None: none)."""

  step: int = 0
  method: dict | None = None
  ahead_step: int | None = None

  @classmethod
  def of(cls, meta: dict | None) -> Resume:
    """From a checkpoint's metadata (`checkpoint.save`'s); None: a fresh run."""
    if meta is None:
      return cls()
    state = meta["method"] if "method" in meta else {"data": meta["data"]}  # older layout
    ahead = meta.get("ahead_step")
    return cls(int(meta["step"]), state, None if ahead is None else int(ahead))


@dataclasses.dataclass
class Trainer:
  """What a run built. The fields after `method` exist once the warm start has run."""

  run: Run
  verifier: Any  # `rewards.verifiers.open_verifier`'s: score, judge, well_formed
  method: methods.Method
  stack: contextlib.ExitStack
  t_start: float
  phases_s: dict[str, float] = dataclasses.field(default_factory=dict)
  start_dir: str = ""
  mngr: Any = None  # orbax CheckpointManager of the RL checkpoints
  resume: Resume = Resume()
  sampler: Any = None
  episodes: envs.Episodes | None = None
  rollout: rollout.Rollout | None = None
  policy: learner.Learner | None = None

  @property
  def s(self) -> experiment.Settings:
    return self.run.settings

  @property
  def model_cfg(self) -> model_lib.ModelConfig:
    """The run's architecture; SFT, or the model `sft.init_from` names (`sft.check_fits`),
    keeps it."""
    return self.run.model_cfg

  # ------------------------------------------------------------------ set up
  @classmethod
  def build(cls, s: experiment.Settings, t_start: float | None = None) -> Trainer:
    """The run's data, mesh, method and verifier, every setting checked against them, and the
    reward proven on the training rows (`reward.preflight`); nothing trained yet."""
    r = workdir_lib.setup(s)
    experiment.check_eval_fits(s.eval.sampling, r.context)
    experiment.check_mesh(s, dict(r.mesh.shape))
    experiment.check_env_fits(s.env, r.context)
    workdir_lib.check_phases(r)
    method = methods.make(s.method, r.prompts(r.data.train, "train"))
    stack = contextlib.ExitStack()
    with stack:
      verifier = stack.enter_context(open_verifier(s.reward, s.reward_workers))
      if jax.process_count() > 1:  # every process takes process 0's verdicts
        verifier = Agreed(verifier, distributed.agreed)
      verifier.check_answers(r.data.train, "data.train_path")
      for name, exs in r.data.evals.items():
        verifier.check_answers(exs, f"eval set {name}")
      if s.reward.preflight:  # the reward proven before anything is trained
        said = preflight.check(verifier, s.reward, r.data.train)
        print(said.line(), flush=True)
        r.progress.setdefault("preflight", {}).update(dataclasses.asdict(said))
      t_start = time.time() if t_start is None else t_start
      return cls(r, verifier, method, stack.pop_all(), t_start)

  @contextlib.contextmanager
  def timed(self, phase: str, row: dict | None = None):
    """Adds the block's seconds to `phases_s[phase]`, and to `row` as `time_<phase>`."""
    t0 = time.perf_counter()
    try:
      yield
    finally:
      seconds = time.perf_counter() - t0
      self.phases_s[phase] = self.phases_s.get(phase, 0.0) + seconds
      if row is not None:
        row[f"time_{phase}"] = seconds

  # ------------------------------------------------------------------ the run
  def fit(self) -> dict:
    """The run's phases in order; returns summary.json's contents.

    RL runs from the resumed step to rl.steps. Checkpoints carry the method's state and are
    keyed by the RL step, not the optimizer's update count; with rl.loop.max_staleness=1
    also the buffer built ahead for the next step (`buffer_file`), which a resumed run uses
    as is. SIGINT / SIGTERM end the step in progress, save a checkpoint and exit
    (`interrupt`). An update whose loss or gradient is not finite stops the run before
    anything of its step is saved (`learner.NonFiniteError`, one line with the step and the
    last good checkpoint)."""
    s, steps = self.s, self.s.rl_steps
    with self.stack:
      with self.timed("warm_start"):
        self.warm_start()
      with self.timed("evaluate"):
        self.evaluate_once("before_rl")
      log = outcome.StepLog(self.run, self.method, self.resume.step)
      with interrupt.GracefulStop("RL") as stop, contextlib.closing(self.buffers()) as buffers:
        for step in log.bar:
          times: dict[str, float] = {}
          with self.timed("rl_step", times):
            try:
              m = rollout.rl_step(
                self.policy, self.method, self.rollout, step, buffers, log.samples
              )
            except learner.NonFiniteError as e:
              log.bar.close()  # the error's line below the bar, not in it
              message = outcome.nonfinite_message(e, step, steps, self.mngr)
              raise learner.NonFiniteError(message, e.state) from e
          if s.eval.every and (step + 1) % s.eval.every == 0:
            with self.timed("evaluate", times):
              for name, scores in self.evaluate().items():
                m.update({f"{name}_{k}": v for k, v in scores.items()})
          m.update(times)
          with self.timed("log"):
            log.write(step, m)
          if s.checkpoint.export_every and (step + 1) % s.checkpoint.export_every == 0:
            with self.timed("export"):
              self.export(f"step_{step + 1}")
          stopping = stop.agreed()
          if (step + 1) % s.checkpoint.every == 0 or step + 1 == steps or stopping:
            with self.timed("checkpoint"):
              self.save(step + 1, buffers)
          if stopping:
            log.close()
            stop.exit(
              f"after RL step {step + 1} of {steps} (checkpoint under {self.run.workdir}/checkpoints)"
            )
      log.close()
      log.check_signal()
      with self.timed("evaluate"):
        self.evaluate_once("after_rl")
      with self.timed("export"):
        if s.export_hf:
          self.export()
    return self.summarise()

  def warm_start(self) -> None:
    """SFT (resumable) or the finished one `sft.init_from` names, then what RL runs on: the
    restored or fresh learner state, the sampler serving its weights, the episodes, the
    rollout and the learner."""
    r, s = self.run, self.s
    self.start_dir = warm_start(r)
    self.mngr, state, meta = checkpoint.restore_or_init(
      os.path.join(r.workdir, "checkpoints"),
      self.model_cfg,
      s.rl_learner,
      r.mesh,
      lambda: model_lib.load_hf(self.start_dir, mesh=r.mesh)[1],
      seed=s.seed,
      keep=s.checkpoint.keep,
    )
    self.stack.callback(self.mngr.close)
    self.resume = Resume.of(meta)
    if meta is not None:
      self.method.restore(self.resume.method)
      print(f"resumed {self.method.name} from step {self.resume.step}")
    weights = learner.policy_weights(state)
    loop = s.rl_loop
    options = server_options(
      s, self.model_cfg.max_position_embeddings, device=s.sampler.local_device
    )
    served = os.path.join(r.workdir, "served", f"process_{jax.process_index()}")
    urls = self.stack.enter_context(
      sampler_build.local_servers(s.sampler, served, options, self.model_cfg, weights, r.tokenizer)
    )
    self.sampler = sampler_build.make_sampler(
      s.sampler,
      self.model_cfg,
      weights,
      r.tokenizer,
      mesh=r.mesh,
      pad_id=r.pad_id,
      sync_dir=os.path.join(r.workdir, "weights"),
      version=self.resume.step,
      urls=urls,
    )
    self.episodes = envs.for_run(s.env, r.tokenizer)
    self.rollout = rollout.Rollout(
      self.sampler,
      self.verifier.score,
      rl=loop,
      encode=r.encode,
      encode_task=r.encode_task,
      answer_of=r.data.answer_of,
      shaping_cfg=s.shaping,
      well_formed=self.verifier.well_formed,
      episodes=self.episodes,
    )
    self.policy = learner.Learner.build(
      self.model_cfg, s.rl_learner, r.mesh, state, loop.batch_shape, loop.seed, r.pad_id
    )

  def evaluate(self, tag: str | None = None) -> dict:
    """pass@k (and the share of well-formed and truncated responses) of every eval set,
    before, during and after RL alike; with a tag, a report under workdir/eval_<tag>."""
    return evaluation.evaluate_run(self.run, self.sampler, self.verifier, tag, self.episodes)

  def evaluate_once(self, tag: str) -> None:
    """The before_rl or after_rl evaluation, unless progress.json has it for this run."""
    r, key = self.run, "eval_before" if tag == "before_rl" else "eval_after"
    if tag == "before_rl" and key in r.progress:
      print(f"eval before RL: done before, reusing {r.workdir}/progress.json", flush=True)
      return
    if tag == "after_rl" and r.progress.get("eval_after_step") == self.s.rl_steps:
      return
    r.progress[key] = self.evaluate(tag)
    if tag == "before_rl":
      said = preflight.before_rl(r.progress[key], self.s.eval.sampling.max_tokens)
      if said:  # what the policy writes, before step 1: why it earns no signal
        print(said, flush=True)
        r.progress.setdefault("preflight", {})["before_rl"] = said
    else:
      r.progress["eval_after_step"] = self.s.rl_steps
    r.save_progress()

  def export(self, step: str = "") -> None:
    """The policy as an HF dir, policy/ (or policy_steps/<step>/); LoRA: its adapter too,
    policy_adapter/ (or policy_adapter_steps/<step>/)."""
    r, state = self.run, self.policy.state
    where = lambda name: os.path.join(r.workdir, f"{name}_steps", step) if step else name
    path = self.s.model.path
    hub_id = path and not os.path.isdir(path) and self.start_dir == r.model_dir
    base = path if hub_id else os.path.abspath(self.start_dir)  # what PEFT loads it on
    out = os.path.join(r.workdir, where("policy"))
    checkpoint.export_hf(out, self.model_cfg, state, tokenizer=r.tokenizer)
    adapter = os.path.join(r.workdir, where("policy_adapter"))
    checkpoint.export_adapter(adapter, self.model_cfg, state, base=base)

  def buffers(self) -> rollout.Buffers:
    """The step's buffers; with rl.loop.max_staleness=1, one built ahead, the resumed run's
    from its checkpoint."""
    ctx, steps = self.rollout, self.s.rl_steps
    buffers = rollout.Buffers(
      self.method, ctx, overlap=ctx.sampler.overlaps_update, last_step=steps
    )
    if buffers.ahead and not buffers.overlap:
      print(
        "rl.loop.max_staleness=1: the in-process sampler shares the learner's devices, so "
        "each buffer is built one update behind but before that update, not during it "
        "(no overlap; a vLLM sampler overlaps)",
        flush=True,
      )
    if self.resume.ahead_step is not None:
      buffers.pending = buffer_file.load(self.ahead_dir, self.resume.ahead_step)
    return buffers

  @property
  def ahead_dir(self) -> str:
    return os.path.join(self.run.workdir, "checkpoints_ahead")

  def save(self, step: int, buffers: rollout.Buffers) -> None:
    """A checkpoint after `step` RL steps: the learner's state, the method's, and the buffer
    built ahead for the next step, if any."""
    ahead = buffers.pending
    if ahead is not None and distributed.is_writer():
      buffer_file.save(self.ahead_dir, ahead)
    extra = {"ahead_step": ahead.step if ahead is not None else None}
    checkpoint.save(
      self.mngr, self.policy.state, {"method": self.method.state(), "step": step, **extra}
    )
    if distributed.is_writer():
      buffer_file.prune(self.ahead_dir, self.mngr.all_steps())

  def summarise(self) -> dict:
    """Plots and summary.json from the metrics of all invocations."""
    phases = {k: round(v, 1) for k, v in self.phases_s.items()}
    return outcome.write_summary(self.run, self.method, time.time() - self.t_start, phases)


def server_options(s: experiment.Settings, positions: int, **given):
  """The vLLM server options a run's settings imply (`sampling.build.server_options`), for
  its longest sequence: prompt + response, evaluation or episode; `positions`: the model's."""
  loop = s.rl_loop
  longest = max(
    loop.max_prompt_len + loop.max_response_len,
    loop.max_prompt_len + s.eval.sampling.max_tokens,
    s.env.max_total_tokens,
  )
  lora_rank = s.rl_learner.lora.rank
  return sampler_build.server_options(s.sampler, longest, positions, lora_rank, **given)


def warm_start(run: Run) -> str:
  """SFT on the run's worked solutions (resumable), or the finished one `sft.init_from`
  names; returns the HF dir RL starts from."""
  s = run.settings
  if s.sft.init_from:
    return sft.reuse(s.sft.init_from, run.model_dir)
  if s.sft.steps <= 0:
    return run.model_dir
  return sft.train_sft(
    run.model_dir,
    run.data.sft_pairs,
    os.path.join(run.workdir, "sft"),
    learner_cfg=s.sft.learner,  # its cosine horizon: sft.steps
    mesh=run.mesh,
    instruction=s.data.instruction,
    chat_template=s.data.chat_template,
    steps=s.sft.steps,
    batch_size=s.sft.batch_size,
    seed=s.seed,
    checkpoint_every=s.checkpoint.every * 10,
    keep=s.checkpoint.keep,
    model_cfg=run.model_cfg,
  )
