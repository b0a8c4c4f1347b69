"""A whole run as a short pipeline: set up -> SFT -> evaluate -> train -> evaluate -> summary.

`run(config)` is what `launch/train.py` calls. Every phase writes into the
work dir, and rerunning the same command resumes: a finished SFT phase is
reloaded from `sft/model/`, RL from its last orbax checkpoint together with
the method's own state (data position, curriculum, question bank), finished
evaluations from `progress.json`. The RL method comes from `methods.make`;
nothing here depends on which one it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp

from rlvr import envs, learner, methods, rollout
from rlvr import model as model_lib
from rlvr.data import tokens
from rlvr.model import lora as lora_lib
from rlvr.parallel import distributed
from rlvr.report import health, plots, samples_log
from rlvr.report import metrics as metrics_lib
from rlvr.rewards import preflight
from rlvr.rewards.verifiers import VERIFIERS, open_verifier
from rlvr.rollout import buffer_file
from rlvr.run import checkpoint, evaluation, experiment, interrupt, sft
from rlvr.run import workdir as workdir_lib
from rlvr.run.workdir import Run
from rlvr.sampling import JaxSampler
from rlvr.sampling.split import HostChannel


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
  )


def server_options(s: experiment.Settings, positions: int, **given):
  """The vLLM server options a run's settings imply: its model name, the longest
  sequence it samples (prompt + response, evaluation or episode, rounded up to 256 and
  capped at the model's `positions`), the weight-transfer backend, and LoRA's rank when
  adapters are pushed (`sampler.lora_adapters`: rl.learner.lora.rank); `given`: the
  options that are not settings of the run (device, host, port, dtype, ...)."""
  from rlvr.sampling.vllm_server import ServerOptions

  c, loop = s.sampler, s.rl_loop
  longest = max(
    loop.max_prompt_len + loop.max_response_len,
    loop.max_prompt_len + s.eval.sampling.max_tokens,
    s.env.max_total_tokens,
  )
  return ServerOptions(
    served_model_name=c.model,
    max_model_len=min(-(-longest // 256) * 256, positions),
    weight_transfer=c.transfer_backend if c.weight_sync == "transfer" else None,
    lora_rank=s.rl_learner.lora.rank if c.lora_adapters else 0,
    **given,
  )


@contextlib.contextmanager
def local_servers(run: Run, model_cfg, weights):
  """`sampler.local_servers` vLLM servers on this host for the run, each serving an untied
  copy of `weights` (a tied LM head does not follow in-place reloads) and stopped when the
  run ends (tethered: also when it dies); yields their URLs, () when the run has none."""
  c = run.settings.sampler
  if c.kind != "vllm" or not c.local_servers:
    yield ()
    return
  from rlvr.sampling.vllm_sampler import serve_policy_copy
  from rlvr.sampling.vllm_server import start_server

  folder = os.path.join(run.workdir, "served", f"process_{jax.process_index()}")
  base, _ = lora_lib.unmerged(weights)  # LoRA: the servers take the base, adapters by push
  serve_policy_copy(folder, model_cfg, base, tokenizer=run.tokenizer)
  options = server_options(run.settings, model_cfg.max_position_embeddings, device=c.local_device)
  servers = []
  try:
    for i in range(c.local_servers):
      print(f"sampler: starting local vLLM server {i + 1}/{c.local_servers}", flush=True)
      log = os.path.join(run.workdir, "served", f"vllm-{jax.process_index()}-{i}.log")
      servers.append(start_server(folder, options, log_path=log))
      print(f"sampler: vLLM up at {servers[-1].url} ({servers[-1].startup_s:.0f} s)", flush=True)
    yield tuple(s.url for s in servers)
  finally:
    for server in servers:
      server.stop()


def make_sampler(run: Run, model_cfg, params, version: int = 0, urls=()):
  """The configured sampler, serving `params` as `version` (the RL step they follow);
  urls: the run's own servers (`local_servers`), else `sampler.urls`."""
  c = run.settings.sampler
  if c.kind == "jax":
    sampler = JaxSampler(model_cfg, params, run.tokenizer, mesh=run.mesh)
    sampler.version = version
    return sampler
  if c.kind != "vllm":
    raise ValueError(f"sampler.kind: unknown {c.kind!r}; expected jax|vllm")
  from rlvr.sampling.split import ProcessSplitSampler
  from rlvr.sampling.vllm_sampler import VLLMSampler

  if not c.urls and not urls:
    raise ValueError("sampler.urls: vllm sampler needs at least one server URL")
  # Multi-host: each process talks to its own servers ("{process}" in a URL is its index;
  # "localhost" is each host's own) and samples its slice of every rollout.
  urls = list(urls) or [u.format(process=jax.process_index()) for u in c.urls]
  client = VLLMSampler(
    urls,
    model_config=model_cfg,
    eos_token_id=run.tokenizer.eos_token_id,
    pad_token_id=run.pad_id,
    sync_dir=os.path.join(run.workdir, "weights"),
    model_name=c.model,
    max_concurrency=c.max_concurrency,
    sync_dtype=jnp.dtype(c.sync_dtype),
    request_timeout_s=c.request_timeout_s,
    retries=c.retries,
    backoff_s=c.backoff_s,
    lora_adapters=c.lora_adapters,
    api_key=c.api_key or None,  # default: $VLLM_API_KEY
    weight_sync=c.weight_sync,  # "disk" or "transfer" (vLLM's weight-transfer API)
    transfer_backend=c.transfer_backend,
    transfer_host=c.transfer_host,
    transfer_bucket_mb=c.transfer_bucket_mb,
  )
  client = ProcessSplitSampler(client) if jax.process_count() > 1 else client
  client.update_weights(params, version=version)
  return client


def make_episodes(run: Run, env_cfg: envs.EnvConfig) -> envs.Episodes:
  """The episodes of the run's environment (`env` section), over the run's tokenizer."""
  agree = None
  if jax.process_count() > 1:  # every process takes process 0's observations
    channel = HostChannel()
    agree = lambda rows: json.loads(channel.allgather(json.dumps(rows).encode())[0])
  return envs.episodes_for(env_cfg, envs.make(env_cfg), run.tokenizer, agree)


def evaluate(
  run: Run,
  sampler,
  score_fn,
  tag: str | None = None,
  episodes: envs.Episodes | None = None,
  well_formed=None,
) -> dict:
  """pass@k of every eval set (episodes: in the run's environment; well_formed: the
  verifier's, for the share of responses that state an answer); with a tag, also a report
  under workdir/eval_<tag>."""
  ecfg = run.settings.eval.sampling
  write = tag is not None and distributed.is_writer()
  outdir = os.path.join(run.workdir, f"eval_{tag}") if write else None
  results = {}
  for name, prompts in run.eval_prompts.items():
    samples = (
      os.path.join(outdir, f"samples_{name}.jsonl") if write and run.settings.eval.samples else None
    )
    results[name] = evaluation.evaluate_set(
      sampler,
      prompts,
      score_fn,
      ecfg,
      progress=tag is not None,
      context=run.context,
      samples_path=samples,
      episodes=episodes,
      well_formed=well_formed,
    )
  if write:
    evaluation.write_report(results, outdir, f"eval {tag}")
    for name, r in results.items():  # one line per set, after the progress bars
      k = max(r["pass@k"], key=int)
      skipped = f", {r['skipped_too_long']} too long skipped" if r["skipped_too_long"] else ""
      formed = f", {100 * r['well_formed'][0]:.1f}% well-formed" if "well_formed" in r else ""
      print(
        f"eval {tag.replace('_', ' ')}: {name} pass@1 {100 * r['pass@k'][1][0]:.1f}% "
        f"(pass@{k} {100 * r['pass@k'][k][0]:.1f}%){formed}, {r['problems']} problems{skipped}",
        flush=True,
      )
  return {
    name: {f"pass@{k}": v[0] for k, v in r["pass@k"].items()}
    | ({"well_formed": r["well_formed"][0]} if "well_formed" in r else {})
    | {"truncated": r["truncated"][0]}
    for name, r in results.items()
  }


def train(
  run: Run,
  policy: learner.Learner,
  mngr,
  method,
  ctx: rollout.StepContext,
  eval_score,
  meta=None,
  export=None,
) -> None:
  """RL steps of `policy` (a `learner.Learner`, whose state they advance) from the restored
  checkpoint's step (`meta`; None: from 0) to rl.steps; checkpoints carry the method's state and are keyed by the RL step, not by the
  optimizer's update count. With rl.loop.max_staleness=1 a checkpoint also keeps the
  buffer built ahead for the next step (`buffer_file`), which a resumed run uses as is.

  SIGINT / SIGTERM end the step in progress, save a checkpoint and exit (`interrupt`). An
  update whose loss or gradient is not finite stops the run before anything of its step is
  saved: `learner.NonFiniteError`, one line with the step and the last good checkpoint.
  `export(policy.state, "step_<k>")` writes the policy every checkpoint.export_every steps
  (checkpoint.export_every).
  """
  from tqdm import tqdm

  s = run.settings
  steps = s.rl_steps
  start = int(meta["step"]) if meta is not None else 0
  ahead_dir = os.path.join(run.workdir, "checkpoints_ahead")
  buffers = rollout.Buffers(method, ctx, overlap=ctx.sampler.overlaps_update, last_step=steps)
  if buffers.ahead and not buffers.overlap:
    print(
      "rl.loop.max_staleness=1: the in-process sampler shares the learner's devices, so "
      "each buffer is built one update behind but before that update, not during it "
      "(no overlap; a vLLM sampler overlaps)",
      flush=True,
    )
  if meta is not None and meta.get("ahead_step") is not None:
    buffers.pending = buffer_file.load(ahead_dir, int(meta["ahead_step"]))
  writer = metrics_lib.MetricsWriter(
    run.workdir,
    resume_step=start,
    enabled=distributed.is_writer(),
    logging=run.settings.logging,
    config=s.written,
  )
  monitor = health_monitor(s)
  if distributed.is_writer():  # a resumed run's earlier steps: no episode of trouble warns twice
    health.replay(monitor, metrics_lib.read_jsonl(writer.path))
  samples = samples_log.SamplesLog(  # rl.log_samples_every: workdir/samples/step_<k>.jsonl
    run.workdir,
    s.rl_log_samples_every,
    resume_step=start,
    decode=lambda ids: tokens.decode_marked(run.tokenizer, ids),
    show=lambda step, rows: writer.write_table(step, "samples", rows),
    enabled=distributed.is_writer(),
  )

  def save(step):
    ahead = buffers.pending
    if ahead is not None and distributed.is_writer():
      buffer_file.save(ahead_dir, ahead)
    extra = {"ahead_step": ahead.step if ahead is not None else None}
    checkpoint.save(mngr, policy.state, {"method": method.state(), "step": step, **extra})
    if distributed.is_writer():
      buffer_file.prune(ahead_dir, mngr.all_steps())

  if start >= steps:  # a rerun of a finished run: no bar of the steps done before
    print(f"RL: done before, all {steps} steps (checkpoints under {run.workdir})")
  bar = tqdm(
    range(start, steps),
    desc=method.name,
    unit="step",
    initial=start,
    total=steps,
    disable=start >= steps,
  )
  skipped, solved = 0, []
  with interrupt.GracefulStop("RL") as stop:
    try:
      for step in bar:
        try:
          m = rollout.rl_step(policy, method, ctx, step, buffers, samples)
        except learner.NonFiniteError as e:
          bar.close()  # the error's line below the bar, not in it
          message = nonfinite_message(e, step, steps, mngr)
          raise learner.NonFiniteError(message, e.state) from e
        skipped += m.get("skipped_update", 0)
        solved.append((m.get("solve_all", 0.0), m.get("solve_none", 0.0)))
        if s.eval.every and (step + 1) % s.eval.every == 0:
          for name, scores in evaluate(run, ctx.sampler, eval_score, None, ctx.episodes).items():
            m.update({f"{name}_{k}": v for k, v in scores.items()})
        if distributed.is_writer():  # a line, a metric and an alert per episode of trouble
          m.update(health.announce(monitor.observe(step, m), writer.alert))
        writer.write(step, m)
        post = {
          "acc": f"{m.get('accuracy', float('nan')):.2f}",
          "ent": f"{m.get('entropy', 0):.2f}",
          "kept": m.get("groups_kept", 0),
        }
        post.update({label: m.get(key, 0) for label, key in method.progress_keys.items()})
        bar.set_postfix(post)
        if export is not None and s.checkpoint.export_every:
          if (step + 1) % s.checkpoint.export_every == 0:
            export(policy.state, f"step_{step + 1}")
        stopping = stop.agreed()
        if (step + 1) % s.checkpoint.every == 0 or step + 1 == steps or stopping:
          save(step + 1)
        if stopping:
          writer.close()
          stop.exit(
            f"after RL step {step + 1} of {steps} (checkpoint under {run.workdir}/checkpoints)"
          )
    finally:
      buffers.close()
  writer.close()
  if start < steps and skipped == steps - start:
    raise rollout.NoSignalError(no_update_message(solved, run.workdir))


def health_monitor(s: experiment.Settings) -> health.Monitor:
  """The run's health warnings (the `health` section, docs/health.md); reward against
  correctness where the reward is more than the verifier's verdict (shaping, a custom one)."""
  custom = s.shaping.active or s.reward.domain not in VERIFIERS
  return health.Monitor(s.health, custom_reward=custom, format_bonus=s.shaping.format_bonus)


def nonfinite_message(error: Exception, step: int, steps: int, mngr) -> str:
  """The error of an RL step (0-based `step`) whose update had a loss or gradient that was
  not finite (`learner.NonFiniteError`): the step, the learner's line, the newest
  checkpoint (saved before it: no checkpoint holds this step's state)."""
  last = mngr.latest_step()
  where = str(mngr.directory)
  kept = (
    f"the last good checkpoint is step {last} in {where}"
    if last is not None
    else f"no checkpoint was saved before it (in {where})"
  )
  return f"RL step {step + 1} of {steps}: {error}; nothing of this step was saved, {kept}"


def no_update_message(solved, workdir: str) -> str:
  """The error of an invocation whose every RL step skipped its update; solved: the
  (solve_all, solve_none) of each of its steps."""
  solve_all, solve_none = (sum(x) / len(solved) for x in zip(*solved))
  return (
    f"every one of the {len(solved)} RL steps skipped its update: no group had a learning "
    f"signal (reward variance; solve_all {solve_all:.0%}, solve_none {solve_none:.0%}); "
    f"{rollout.no_signal_fix(solve_all, solve_none)}; see {workdir}/metrics.jsonl"
  )


def write_summary(run: Run, method, seconds: float) -> dict:
  """Plots and summary.json from the metrics of all invocations."""
  rows = metrics_lib.read_jsonl(os.path.join(run.workdir, "metrics.jsonl"))
  name = os.path.basename(run.workdir)
  if rows and distributed.is_writer():
    plots.plot_metrics(
      rows,
      plots.TRAINING_PANELS,
      os.path.join(run.workdir, "training.png"),
      title=name,
      before=run.progress.get("eval_before"),
      after=run.progress.get("eval_after"),
    )
    if method.plot_keys:
      mark = method.mark_key
      plots.plot_metrics(
        rows,
        method.plot_keys,
        os.path.join(run.workdir, f"{method.name}.png"),
        title=f"{name}: {method.name}",
        marks=[r["step"] + 1 for r in rows if mark and r.get(mark)],
      )
  reports = {
    label: os.path.join(run.workdir, f"eval_{tag}", "eval.json")
    for label, tag in (("before RL", "before_rl"), ("after RL", "after_rl"))
  }
  if distributed.is_writer() and all(os.path.exists(p) for p in reports.values()):
    evaluation.plot_comparison(
      {label: workdir_lib.json_file(p) for label, p in reports.items()},
      os.path.join(run.workdir, "pass_at_k.png"),
      name,
    )
  summary = {
    "steps": run.settings.rl_steps,
    "eval_before_rl": run.progress["eval_before"],
    "eval_after_rl": run.progress["eval_after"],
    "time_s_this_invocation": round(seconds, 1),
    "method": method.name,
    "preflight": run.progress.get("preflight"),
    "health": [w.as_dict() for w in health.replay(health_monitor(run.settings), rows)],
    "model_dir": run.model_dir,
    "workdir": run.workdir,
    **method.summary(rows),
  }
  return workdir_lib.json_file(os.path.join(run.workdir, "summary.json"), summary)


def _restore_method(method, meta) -> None:
  # Metadata without a "method" entry (an older checkpoint layout) holds only the data position.
  method.restore(meta["method"] if "method" in meta else {"data": meta["data"]})
  print(f"resumed {method.name} from step {meta['step']}")


# ------------------------------------------------------------------------ run
def run(cfg) -> dict:
  """Runs (or resumes) the experiment described by an ml_collections config, holding the
  work dir's lock (`fileio.workdir_lock`): a second run on the same work dir stops at
  once with one line naming the holder's pid and host."""
  t_start = time.time()
  s = experiment.check(cfg)  # every setting, before anything is built or trained
  distributed.initialize(s.coordinator or None)
  workdir = os.path.abspath(s.workdir)
  os.makedirs(workdir, exist_ok=True)
  with workdir_lib.lock(workdir):
    return _run(s, t_start)


def _run(s: experiment.Settings, t_start: float) -> dict:
  r = workdir_lib.setup(s)
  experiment.check_eval_fits(s.eval.sampling, r.context)
  experiment.check_mesh(s, dict(r.mesh.shape))
  experiment.check_env_fits(s.env, r.context)
  workdir_lib.check_phases(r)
  method = methods.make(s.method, r.prompts(r.data.train, "train"))
  with contextlib.ExitStack() as stack:
    verifier = stack.enter_context(open_verifier(s.reward, s.reward_workers))
    verifier.check_answers(r.data.train, "data.train_path")
    for name, exs in r.data.evals.items():
      verifier.check_answers(exs, f"eval set {name}")
    if s.reward.preflight:  # the reward proven before anything is trained
      report = preflight.check(verifier, s.reward, r.data.train)
      print(report.line(), flush=True)
      r.progress.setdefault("preflight", {}).update(dataclasses.asdict(report))
    score, eval_score = verifier.score, verifier.for_eval().judge
    start_dir = warm_start(r)
    model_cfg = model_lib.ModelConfig.from_hf(start_dir)
    mngr, state, meta = checkpoint.restore_or_init(
      os.path.join(r.workdir, "checkpoints"),
      model_cfg,
      s.rl_learner,
      r.mesh,
      lambda: model_lib.load_hf(start_dir, mesh=r.mesh)[1],
      seed=s.seed,
      keep=s.checkpoint.keep,
    )
    if meta is not None:
      _restore_method(method, meta)
    version = int(meta["step"]) if meta else 0
    weights = learner.policy_weights(state)
    urls = stack.enter_context(local_servers(r, model_cfg, weights))
    sampler = make_sampler(r, model_cfg, weights, version, urls)
    episodes = make_episodes(r, s.env)
    if "eval_before" not in r.progress:
      r.progress["eval_before"] = evaluate(
        r, sampler, eval_score, "before_rl", episodes, verifier.well_formed
      )
      said = preflight.before_rl(r.progress["eval_before"], s.eval.sampling.max_tokens)
      if said:  # what the policy writes, before step 1: why it earns no signal
        print(said, flush=True)
        r.progress.setdefault("preflight", {})["before_rl"] = said
      r.save_progress()
    else:
      print(f"eval before RL: done before, reusing {r.workdir}/progress.json", flush=True)
    ctx = rollout.StepContext(
      sampler,
      score,
      rl=s.rl_loop,
      encode=r.encode,
      encode_task=r.encode_task,
      answer_of=r.data.answer_of,
      shaping_cfg=s.shaping,
      well_formed=verifier.well_formed,
      episodes=episodes,
    )

    path = s.model.path
    hub_id = path and not os.path.isdir(path) and start_dir == r.model_dir
    base = path if hub_id else os.path.abspath(start_dir)  # what PEFT loads it on

    def export(state, step: str = ""):
      """The policy as an HF dir, policy/ (or policy_steps/<step>/); LoRA: its adapter
      too, policy_adapter/ (or policy_adapter_steps/<step>/)."""
      where = lambda name: os.path.join(r.workdir, f"{name}_steps", step) if step else name
      checkpoint.export_hf(
        os.path.join(r.workdir, where("policy")), model_cfg, state, tokenizer=r.tokenizer
      )
      checkpoint.export_adapter(
        os.path.join(r.workdir, where("policy_adapter")), model_cfg, state, base=base
      )

    loop = s.rl_loop
    policy = learner.Learner.build(
      model_cfg, s.rl_learner, r.mesh, state, loop.batch_shape, loop.seed, r.pad_id
    )
    train(r, policy, mngr, method, ctx, eval_score, meta, export=export)
    mngr.close()
    if r.progress.get("eval_after_step") != s.rl_steps:
      r.progress["eval_after"] = evaluate(
        r, sampler, eval_score, "after_rl", episodes, verifier.well_formed
      )
      r.progress["eval_after_step"] = s.rl_steps
      r.save_progress()
    if s.export_hf:
      export(policy.state)
  return write_summary(r, method, time.time() - t_start)
