r"""RL training (SFT warm start, evaluation, RL) from an ml_collections config.

  python -m launch.train --config=configs/tiny.py
  python -m launch.train --config=configs/tiny.py --config.rl.steps=5 --workdir=/tmp/run
  python -m launch.train --config=configs/tiny.py --print_config     # resolved config, no run

Rerunning the same command resumes from the work dir's last checkpoint; Ctrl-C
or SIGTERM stops after the current step with a checkpoint saved.
"""

import json
import os
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

      return list(ast.literal_eval(text))
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
# checkpoint that does not verify (`rlvr.checkpoint.CheckpointError`, a ValueError), a work
# dir another run holds, or a disk that cannot be written (full, read-only: `fileio.disk_error`
# names the path and what to do): one line on stderr, exit 1. Anything else is a bug and
# keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError)


def parse_flags(argv):
  """absl parsing, with a bad flag or config key reported in one line (exit 2)."""
  try:
    rest = FLAGS(argv)
    FLAGS.config.to_dict()  # config files load lazily: fail here, not inside the run
    return rest
  except Exception as e:  # noqa: BLE001 - flags / config_flags raise many kinds
    text = " ".join(str(e).replace("\\n", " ").replace("\\'", "'").split()).strip("'\" ")
    if isinstance(e, AttributeError):  # ml_collections: a config key that does not exist
      text = f"unknown config field {text}"
    sys.stderr.write(f"launch.train: {text}\n")
    sys.exit(2)


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
  from rlvr import fileio, loop, oom, runner
  from rlvr.rewards.code import CodeSandboxError
  from rlvr.sampling.assistant import AssistantError
  from rlvr.sampling.vllm_sampler import SamplerError
  from rlvr.sampling.vllm_server import ServerStartError

  # Outside the SFT / RL loops (which stop after a whole step and save, `rlvr.interrupt`),
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
    summary = runner.run(cfg)
  except KeyboardInterrupt as e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    if FLAGS.verbose:
      raise
    signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
    sys.stderr.write(
      f"\nstopped by {signal.Signals(signum).name} outside a training step; the "
      f"finished phases are kept under {cfg.workdir}; rerun the same command "
      "to resume\n"
    )
    sys.exit(128 + signum)
  except (
    *USER_ERRORS,
    fileio.WorkdirBusyError,
    loop.NoSignalError,
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
  print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, indent=2))
  for k, v in summary.items():  # per-step lists on one line each
    if isinstance(v, list):
      print(f"{k}: {json.dumps(v)}")
  print(
    f"summary: {os.path.abspath(cfg.workdir)}/summary.json (plots: training.png, "
    "pass_at_k.png and the method's own .png beside it)"
  )


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
