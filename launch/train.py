r"""RL training (SFT warm start, evaluation, RL) from an ml_collections config.

  python -m launch.train --config=configs/tiny.py
  python -m launch.train --config=configs/tiny.py --config.rl.steps=5 --workdir=/tmp/run
  python -m launch.train --config=configs/tiny.py --print_config     # resolved config, no run

Rerunning the same command resumes from the work dir's last checkpoint; Ctrl-C
or SIGTERM stops after the current step with a checkpoint saved.
"""

import importlib.util
import os
import re
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags


class _ListParser(flags.ArgumentParser):
  """List fields (sampler.urls, data.eval_paths, ...) from the command line, which
  ml_collections does not override itself: `--config.sampler.urls=http://a:8000,http://b:8000`
  (comma-separated) or a Python literal `'["a", "b"]'`; an empty value is []."""

  def parse(self, argument):
    if not isinstance(argument, str):
      return list(argument)
    text = argument.strip()
    if text.startswith(("[", "(")):
      import ast

      try:
        return list(ast.literal_eval(text))
      except (SyntaxError, ValueError, TypeError):
        raise ValueError(
          f"must be comma-separated items or a Python list, got {argument!r}"
        ) from None
    return [part.strip() for part in text.split(",") if part.strip()]

  def flag_type(self):
    return "list"


config_flags.register_flag_parser_for_type(list, _ListParser())

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/tiny.py", "Experiment config.", lock_config=True)
flags.DEFINE_string("workdir", None, "Work dir (default: the config's workdir).")
flags.DEFINE_bool("print_config", False, "Print the resolved config and exit.")
flags.DEFINE_bool(
  "verbose",
  False,
  "On an error that stops the run, print the whole traceback "
  "(default: one line naming what to set).",
)

# What a run raises for bad settings or data (messages name the field, file or row), a
# checkpoint that does not verify (`rlvr.run.checkpoint_integrity.CheckpointError`, a
# ValueError), a work dir another run holds, or a disk that cannot be written (full,
# read-only: `fileio.disk_error` names the path and what to do): one line on stderr, exit 1.
# Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError)


# absl's reasons for a value it could not parse -> what the field must be.
_PARSE_REASONS = (
  (re.compile(r"^\('Non-boolean argument to boolean flag', .*\)$"), "must be true or false"),
  (re.compile(r"^invalid literal for int\(\)"), "must be an integer"),
  (re.compile(r"^could not convert string to float"), "must be a number"),
)


def _unknown_key(text: str, argv) -> str:
  """ml_collections' "'stepz' Did you mean "steps"..." as the key's path in the config."""
  said = re.fullmatch(r"""["']*([\w-]+)["']*(?: Did you mean "([^"]+)".*)?""", text)
  if said is None:  # an AttributeError of the config file's own code
    return text
  key, hint = said.groups()
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=", 1)[0]
    parts = name.split(".")
    if parts[0] == "config" and key in parts[1:]:
      path, written = parts[1 : parts.index(key, 1)], parts[parts.index(key, 1) :]
      break
  else:
    path, written = [], [key]
  from rlvr.common import vocabulary
  from rlvr.run import experiment

  full = ".".join([*path, key])
  source = experiment.derived_paths().get(full)
  if source is not None:
    return f"{full}: set {source} instead (one value for the whole run)"
  if experiment.moved_line(full):
    return experiment.moved_line(full)
  theirs = vocabulary.unknown_field(".".join(path), ".".join(written))  # verl's, TRL's names
  if theirs:
    return theirs
  line = f"unknown config field {full}"
  if hint:
    return line + f"; did you mean {'.'.join([*path, hint])}?"
  named = _fields_ending(key, argv)
  return line + (f"; did you mean {' or '.join(named[:3])}?" if named else "")


def _fields_ending(key: str, argv) -> list[str]:
  """The config's fields whose last part is `key` (learning_rate -> rl.learner.learning_rate),
  read from the --config file as the flags name it; [] when it does not load."""
  spec = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
  if spec is None:
    return []
  path, _, arg = spec.partition(":")
  try:
    loaded = importlib.util.spec_from_file_location("_rlvr_config", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    flat = config.to_dict()
  except Exception:  # noqa: BLE001 - only a hint: a config that does not load gives none
    return []

  def walk(d, prefix):
    for k, v in d.items():
      yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

  return sorted(f for f in walk(flat, "") if f.rsplit(".", 1)[-1] == key)


def flag_error(e: Exception, argv) -> str:
  """One line for a flag or config key absl / ml_collections refused: the field as the
  config names it (rl.steps), what it must be, the value given."""
  text = " ".join(str(e).replace("\\n", " ").replace("\\'", "'").split())
  missing = re.search(
    r"Failed loading config file .*?\[Errno 2\] No such file or directory: (.*)$", text
  )
  if missing:
    return f"--config: no such file {missing.group(1)}"
  if isinstance(e, (AttributeError, KeyError)):  # ml_collections: a key that does not exist
    return _unknown_key(text, argv)
  bad = re.match(r"^flag --([^=\s]+)=(.*?): (.*)$", text)
  if isinstance(e, flags.IllegalFlagValueError) and bad:
    name, value, why = bad.groups()
    field = name[len("config.") :] if name.startswith("config.") else f"--{name}"
    must = next((must for pattern, must in _PARSE_REASONS if pattern.match(why)), None)
    return f"{field}: {must}, got {value!r}" if must else f"{field}: {why}"
  return text


def parse_flags(argv):
  """absl parsing, with a bad flag or config key reported in one line (exit 2)."""
  try:
    rest = FLAGS(argv)
    FLAGS.config.to_dict()  # config files load lazily: fail here, not inside the run
    return rest
  except Exception as e:  # noqa: BLE001 - flags / config_flags raise many kinds
    sys.stderr.write(f"launch.train: {flag_error(e, argv)}\n")
    sys.exit(2)


# summary.json fields every run has; the method adds its own (`Method.summary`).
_RUN_FIELDS = (
  "steps",
  "eval_before_rl",
  "eval_after_rl",
  "time_s_this_invocation",
  "method",
  "model_dir",
  "workdir",
)


def _rates(before: dict | None, after: dict | None) -> list[str]:
  """One line per eval set: pass@1 and the largest k (and the well-formed share), before ->
  after RL."""
  before, after = before or {}, after or {}
  lines = []
  for name in dict.fromkeys([*before, *after]):
    b, a = before.get(name, {}), after.get(name, {})
    ks = sorted({k for k in (*b, *a) if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    shown = []
    for k in [*dict.fromkeys([ks[0], ks[-1]] if ks else ()), "well_formed"]:
      if k not in b and k not in a:
        continue
      values = [f"{100 * r[k]:.1f}%" for r in (b, a) if k in r]
      shown.append(f"{k.replace('_', '-')} {' -> '.join(values)}")
    lines.append(f"{name}: {', '.join(shown)}" + (" (before -> after RL)" if b and a else ""))
  return lines


def summary_lines(summary: dict, workdir: str) -> list[str]:
  """The end of a run in a few lines: steps, held-out rates, the method's own figures (its
  per-step lists stay in summary.json), where the rest is."""
  lines = [
    f"RL: {summary['steps']} steps of {summary['method']} "
    f"({summary['time_s_this_invocation']:.0f} s in this invocation)"
  ]
  lines += _rates(summary.get("eval_before_rl"), summary.get("eval_after_rl"))
  own = [
    f"{k} {v}"
    for k, v in summary.items()
    if k not in _RUN_FIELDS and isinstance(v, (int, float, str))
  ]
  if own:
    lines.append(f"{summary['method']}: {', '.join(own)}")
  lines.append(
    f"summary: {workdir}/summary.json (all figures and per-step lists; plots: training.png, "
    "pass_at_k.png and the method's own .png beside it)"
  )
  return lines


def _plan_command() -> str:
  """bench/plan.py on this run's config: the RL update's memory, from the compiler."""
  import jax

  path = config_flags.get_config_filename(FLAGS["config"])
  more = (
    " (with the same --config.* flags)"
    if any(a.startswith("--config.") for a in sys.argv[1:])
    else ""
  )
  return f"python bench/plan.py --config={path} --devices={jax.device_count()}{more}"


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines drown the progress bars
  cfg = FLAGS.config
  if FLAGS.workdir:
    with cfg.unlocked():
      cfg.workdir = FLAGS.workdir
  if FLAGS.print_config:
    print(cfg)
    return
  from rlvr import rollout
  from rlvr.common import fileio, progress
  from rlvr.rewards.code import CodeSandboxError
  from rlvr.run import oom, runner
  from rlvr.sampling.assistant import AssistantError
  from rlvr.sampling.vllm_sampler import SamplerError
  from rlvr.sampling.vllm_server import ServerStartError

  # Outside the SFT / RL loops (which stop after a whole step and save, `rlvr.run.interrupt`),
  # SIGTERM interrupts like Ctrl-C: set-up or an evaluation in progress is abandoned
  # (nothing half-written: results and checkpoints are written whole) and reported below.
  pending = []

  def _interrupt(signum, frame):
    del frame
    pending.append(signum)
    raise KeyboardInterrupt(signum)

  def _raise_again(signum, frame):
    del signum, frame
    raise KeyboardInterrupt(pending[0])

  # Python drops an exception raised while it runs a callback of its own (a gc callback,
  # a __del__) and prints it as "ignored": raise the interrupt again right after, where
  # the run sees it, and print nothing for the dropped one.
  default_hook = sys.unraisablehook

  # A checkpoint save that fails (a full disk) abandons its other TensorStore writes, whose
  # callbacks then find orbax's event loop closed: nothing is lost, the save's own error is
  # reported below; print nothing for them either.
  def _dropped(unraisable):
    if pending and isinstance(unraisable.exc_value, KeyboardInterrupt):
      signal.setitimer(signal.ITIMER_REAL, 0.01)
    elif not (
      isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == "Event loop is closed"
    ):
      default_hook(unraisable)

  sys.unraisablehook = _dropped
  signal.signal(signal.SIGALRM, _raise_again)
  signal.signal(signal.SIGTERM, _interrupt)
  signal.signal(signal.SIGINT, _interrupt)
  try:
    with progress.messages_above_bars(), runner.trainer(cfg) as trainer:  # log lines above bars
      summary = trainer.fit()
  except KeyboardInterrupt as e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    if FLAGS.verbose:
      raise
    signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
    if not progress.close_bars():  # else the line starts after the terminal's "^C"
      sys.stderr.write("\n")
    sys.stderr.write(
      f"stopped by {signal.Signals(signum).name} outside a training step; the "
      f"finished phases are kept under {cfg.workdir}; rerun the same command "
      "to resume\n"
    )
    sys.exit(128 + signum)
  except (
    *USER_ERRORS,
    fileio.WorkdirBusyError,
    rollout.NoSignalError,
    CodeSandboxError,
    AssistantError,
    SamplerError,
    ServerStartError,
  ) as e:
    if FLAGS.verbose:
      raise
    text = fileio.disk_error(e, cfg.workdir) or " ".join(str(e).split())
    sys.stderr.write(f"launch.train: {text} (--verbose for the traceback)\n")
    sys.exit(1)
  except Exception as e:  # noqa: BLE001 - a full or read-only disk and out of memory are
    # reported in one line, the rest raised
    disk = fileio.disk_error(e, cfg.workdir)
    if FLAGS.verbose or not (disk or oom.is_oom(e)):
      raise
    line = disk or oom.describe(e, plan=_plan_command())
    sys.stderr.write(f"launch.train: {line} (--verbose for the traceback)\n")
    sys.exit(1)
  print("\n".join(summary_lines(summary, os.path.abspath(cfg.workdir))))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
