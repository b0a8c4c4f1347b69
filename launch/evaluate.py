r"""pass@k / avg@n of a model on one or more eval sets, over sampling seeds.

  python -m launch.evaluate --run=workdir/tiny                # a finished run, its own settings
  python -m launch.evaluate --model=workdir/tiny/policy \
      --data=data/math_aime_eval.jsonl --n=8 --seeds=0,1,2 --max_tokens=1024
  python -m launch.evaluate --model=CODER_DIR --data=humaneval --n=4 --max_tokens=1024

Writes eval.md (table), eval.csv, eval.json, pass_at_k.png and samples_<set>.jsonl (every
response with its reward; for code, its program's verdict and reason) into --workdir.
'humaneval' is scored by running each response's program against the problem's tests in the
sandbox (rlvr.rewards.code), as is any file set with --domain=code.
Samples in-process with JaxSampler, or from vLLM servers with --vllm_urls.
"""

import contextlib
import dataclasses
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string(
  "run",
  None,
  "A finished run's work dir: its policy (RUN/policy) on the "
  "run's own eval sets, instruction and eval settings (RUN/config.json); "
  "flags given explicitly override them.",
)
flags.DEFINE_string(
  "model", None, "HF model directory, hub id or GGUF file (default with --run: RUN/policy)."
)
flags.DEFINE_list(
  "data",
  [],
  "Eval sets (parquet/jsonl/json); 'arithmetic' = the procedural held-out split; "
  "'humaneval' = the 164 HumanEval problems (code, run in the sandbox).",
)
flags.DEFINE_enum(
  "domain",
  None,
  ["math", "code"],
  "How file sets are scored: final answers (math) or programs against the tests in the "
  "answer column (code). Default: the run's reward.domain, else math.",
)
flags.DEFINE_string("workdir", "workdir/eval", "Output directory.")
_EVAL_HELP = {  # the sampling flags: one per rlvr.run.evaluation.EvalConfig field, its default
  "n": "Samples per problem (pass@k for k = 1, 2, 4, ... <= n).",
  "seeds": "Sampling seeds; the report gives mean and std over them.",
  "temperature": "Sampling temperature.",
  "top_p": "Nucleus sampling.",
  "top_k": "Top-k sampling (0 = off).",
  "repetition_penalty": "vLLM / HF repetition penalty (1 = off).",
  "max_tokens": "Response length limit.",
  "batch_prompts": "Prompts per generate call.",
}


def _define_eval_flags() -> None:
  from rlvr.run.evaluation import EvalConfig

  for f in dataclasses.fields(EvalConfig):
    define = {int: flags.DEFINE_integer, float: flags.DEFINE_float}.get(type(f.default))
    if isinstance(f.default, tuple):
      flags.DEFINE_list(f.name, [str(v) for v in f.default], _EVAL_HELP[f.name])
    else:
      define(f.name, f.default, _EVAL_HELP[f.name])


_define_eval_flags()
flags.DEFINE_integer("limit", 0, "Use the first N problems of each set (0 = all).")
flags.DEFINE_string(
  "instruction",
  None,
  "Appended to each problem (default: the run's, else rlvr.data.prompts.DEFAULT_INSTRUCTION).",
)
flags.DEFINE_string(
  "chat_template",
  None,
  "Prompt template: '' (the tokenizer's), 'none' (raw text), 'chatml', or a Jinja file "
  "(default: the run's data.chat_template, else '').",
)
flags.DEFINE_string(
  "env",
  "single_turn",
  "The environment each sample is an episode of: single_turn, python_tool or "
  "package.module:function (default with --run: the run's env section).",
)
flags.DEFINE_bool("integer_answers", False, "AIME-style integer answer matching.")
flags.DEFINE_list(
  "vllm_urls",
  [],
  "Sample from these vLLM servers instead of in-process; "
  "they must already serve the model evaluated (nothing is pushed to them).",
)
flags.DEFINE_string(
  "vllm_model",
  "policy",
  "The model name the vLLM servers serve (default with --run: the run's sampler.model).",
)
flags.DEFINE_bool(
  "samples",
  True,
  "Also write every response, its reward and correctness to WORKDIR/samples_<set>.jsonl.",
)
flags.DEFINE_integer("reward_workers", 2, "math-verify processes.")
flags.DEFINE_bool(
  "preflight",
  False,
  "Only prove the reward (rlvr.rewards.preflight) on the --data sets and, with --run, the "
  "run's training rows, with the run's reward settings (or --domain, --integer_answers): "
  "no model is loaded, nothing is sampled.",
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines drown the progress bars
  import contextlib
  import os

  from transformers import AutoTokenizer

  from rlvr import envs, model
  from rlvr.common import settings
  from rlvr.data import chat_templates
  from rlvr.data import prompts as prompt_lib
  from rlvr.data import readers as data_lib
  from rlvr.rewards.verifiers import open_verifier
  from rlvr.rollout import Prompt
  from rlvr.run import evaluation, oom

  sets, domains, run_cfg = {}, {}, None
  if FLAGS.run:
    run_cfg = _run_settings(FLAGS.run)
    from rlvr.data import datasets

    prepared = datasets.prepare(run_cfg.data, run_cfg.seed)
    sets = {name: exs[: FLAGS.limit or None] for name, exs in prepared.evals.items()}
    if FLAGS.preflight:
      sets = {"data.train_path": prepared.train}
  if FLAGS.preflight:
    return _preflight(run_cfg, sets)
  model_dir = FLAGS.model or (os.path.join(FLAGS.run, "policy") if FLAGS.run else None)
  if not model_dir:
    raise app.UsageError("give --model=HF_DIR or --run=WORKDIR")
  from rlvr.run.workdir import resolve_model

  try:
    model_dir = resolve_model(model_dir, "--model")
  except (FileNotFoundError, ValueError) as e:  # a bad path or GGUF file: one line
    _stop(e)
  pick = lambda name, run_value: (
    FLAGS[name].value if FLAGS[name].present or run_cfg is None else run_value
  )
  cfg, params = model.load_hf(model_dir)
  tok = AutoTokenizer.from_pretrained(model_dir)
  # The sampler a run builds (`sampling.build`): with --run, its client settings (model
  # name, key, timeout, retries); the servers at --vllm_urls sample the weights they serve.
  import dataclasses

  from rlvr.sampling import build
  from rlvr.sampling.config import SamplerConfig

  names = {f.name for f in dataclasses.fields(SamplerConfig)}
  given = {k: v for k, v in dict(run_cfg.sampler).items() if k in names} if run_cfg else {}
  client = dataclasses.replace(SamplerConfig(), **given)
  client = dataclasses.replace(
    client,
    kind="vllm" if FLAGS.vllm_urls else "jax",
    urls=tuple(FLAGS.vllm_urls or ()),
    model=pick("vllm_model", given.get("model", FLAGS.vllm_model)),
    local_servers=0,
  )
  sampler = build.make_sampler(client, cfg, params, tok, push=False)
  for path in FLAGS.data:
    if path == "humaneval":
      from rlvr.data import datasets

      sets["humaneval"] = datasets.humaneval_examples()[: FLAGS.limit or None]
      domains["humaneval"] = "code"
    elif path == "arithmetic":
      from rlvr.data.tasks import arithmetic

      _, heldout = arithmetic.make_splits(0, FLAGS.limit or 256, 1, 0)
      sets["arithmetic-heldout"] = arithmetic.to_examples(heldout)
    else:
      exs = list(data_lib.read_dataset(path))
      sets[os.path.splitext(os.path.basename(path))[0]] = exs[: FLAGS.limit or None]
  run_eval = run_cfg.eval.sampling if run_cfg else {}
  ecfg = evaluation.EvalConfig(
    **{  # each field: its flag if given, else the run's, else default
      f.name: pick(f.name, run_eval.get(f.name, FLAGS[f.name].value))
      for f in dataclasses.fields(evaluation.EvalConfig)
    }
  )
  ecfg = dataclasses.replace(ecfg, seeds=tuple(int(s) for s in ecfg.seeds))
  instruction = pick("instruction", run_cfg.data.instruction if run_cfg else None)
  if instruction is None:
    instruction = prompt_lib.DEFAULT_INSTRUCTION
  run_template = run_cfg.data.get("chat_template", "") if run_cfg else ""
  chat_template = pick("chat_template", run_template) or ""
  try:
    chat_templates.check(chat_template)  # a bad value stops here, before sampling
  except ValueError as e:
    _stop(e)
  rcfg = _reward_settings(run_cfg)
  default_domain = FLAGS.domain or rcfg.domain
  domains = {name: domains.get(name, default_domain) for name in sets}
  workdir = pick("workdir", os.path.join(FLAGS.run or "", "eval_again"))
  # Episodes in the run's environment (env section), or the one --env names.
  env_cfg = envs.EnvConfig()
  if run_cfg is not None and "env" in run_cfg:
    env_cfg = settings.frozen(envs.EnvConfig, run_cfg.env, prefix="env.")
  env_cfg = dataclasses.replace(env_cfg, name=pick("env", env_cfg.name))
  try:
    episodes = envs.episodes_for(env_cfg, envs.make(env_cfg), tok)
  except ValueError as e:
    _stop(e)
  results = {}
  with (
    _one_line(),
    oom.reported("launch.evaluate", "evaluation", "lower --batch_prompts, --max_tokens or --n"),
    contextlib.ExitStack() as stack,
  ):
    verifiers = {  # one per domain evaluated; a missing sandbox stops here, before sampling
      d: stack.enter_context(
        open_verifier(dataclasses.replace(rcfg, domain=d), FLAGS.reward_workers)
      ).for_eval()
      for d in sorted(set(domains.values()))
    }
    for name, exs in sets.items():
      verifier = verifiers[domains[name]]
      verifier.check_answers(exs, f"eval set {name}")
      told = instruction
      if name == "humaneval" and not FLAGS["instruction"].present:
        told = prompt_lib.CODE_INSTRUCTION
      prompts = [
        Prompt(
          tuple(prompt_lib.format_prompt(tok, e.problem, told, chat_template)),
          e.answer,
          e.problem,
          name,
        )
        for e in exs
      ]
      samples = os.path.join(workdir, f"samples_{name}.jsonl") if FLAGS.samples else None
      results[name] = evaluation.evaluate_set(
        sampler,
        prompts,
        verifier.judge,
        ecfg,
        progress=True,
        context=cfg.max_position_embeddings,
        samples_path=samples,
        episodes=episodes,
      )
  report = evaluation.write_report(results, workdir, f"eval {model_dir}")
  print(open(report["markdown"]).read())
  written = "eval.md, eval.csv, eval.json, pass_at_k.png" + (
    ", samples_*.jsonl" if FLAGS.samples else ""
  )
  print(f"launch.evaluate: wrote {written} to {os.path.abspath(workdir)}", flush=True)


def _stop(e: Exception):
  """A user's error (a path, a setting, their reward): one line on stderr, exit 1."""
  sys.stderr.write(f"launch.evaluate: {' '.join(str(e).split())}\n")
  sys.exit(1)


@contextlib.contextmanager
def _one_line():
  """A reward function that fails on a whole call (rewards.custom_caller.RewardFunctionError): one
  line, not a traceback."""
  from rlvr.rewards.custom_caller import RewardFunctionError

  try:
    yield
  except RewardFunctionError as e:
    _stop(e)


def _reward_settings(run_cfg):
  """The reward settings: the run's, with --integer_answers and --domain when given."""
  from rlvr.common import settings
  from rlvr.rewards import RewardConfig

  try:  # a reward module that does not import: one line
    rcfg = settings.frozen(RewardConfig, run_cfg.reward, prefix="reward.") if run_cfg else None
    rcfg = dataclasses.replace(rcfg or RewardConfig(), integer_answers=FLAGS.integer_answers)
    return dataclasses.replace(rcfg, domain=FLAGS.domain) if FLAGS.domain else rcfg
  except ValueError as e:
    _stop(e)


def _preflight(run_cfg, sets: dict) -> None:
  """--preflight: the reward's preflight on each set; one line per set, or the one line
  that says why the reward cannot be trained on."""
  import os

  from rlvr.data import readers
  from rlvr.rewards import preflight
  from rlvr.rewards.verifiers import open_verifier

  for path in FLAGS.data:
    sets[os.path.basename(path)] = list(readers.read_dataset(path))[: FLAGS.limit or None]
  if not sets:
    raise app.UsageError("--preflight: give --run=WORKDIR or --data=FILE")
  rcfg = _reward_settings(run_cfg)
  with _one_line(), open_verifier(rcfg, FLAGS.reward_workers) as verifier:
    for name, exs in sets.items():
      verifier.check_answers(exs, name)
      try:
        report = preflight.check(verifier, rcfg, exs, name)
      except preflight.PreflightError as e:
        _stop(e)
      print(f"{name}: {report.line()}", flush=True)


def _run_settings(workdir: str):
  """The resolved config a run saved (workdir.setup writes WORKDIR/config.json)."""
  import json
  import os

  import ml_collections

  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise app.UsageError(f"--run: {path} not found; is {workdir} the work dir of a run?")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


if __name__ == "__main__":
  app.run(main)
