"""Out of memory as one line: which phase ran out, how much was asked for, what to lower.

XLA reports an allocation it cannot make as a `jax.errors.JaxRuntimeError` (the old
`XlaRuntimeError`) whose message starts with RESOURCE_EXHAUSTED, on CPU ("Out of memory
allocating N bytes"), GPU ("Out of memory while trying to allocate N bytes") and TPU
("Ran out of memory in memory space hbm"); numpy raises `MemoryError`. The launchers
catch both and print `describe(exc, phase)` instead of the traceback (`reported`).

The phase, when not given, is read off the traceback: the outermost frame in a module
of `PHASE_MODULES` (evaluation inside the RL loop is an evaluation, not sampling). JAX
dispatches asynchronously, so an error surfaces where a result is first read; every
phase reads its results inside its own modules (the update its metrics in `rlvr.learner.ppo`,
the sampler its tokens), so the frame names the phase that ran out.
"""

from __future__ import annotations

import contextlib
import re
import sys
import traceback

GIB = 1024**3

# Module (or package) -> phase, matched outermost frame first.
PHASE_MODULES = {
  "rlvr.run.evaluation": "evaluation",
  "rlvr.run.sft": "SFT",
  "rlvr.learner.ppo": "RL update",
  "rlvr.learner": "RL update",
  "rlvr.sampling": "sampling",
}

# Phase -> what to lower, in launch.train's config fields.
ADVICE = {
  "RL update": "use more, smaller micro-batches (lower rl.learner.micro_memory_gb, or set "
  "rl.learner.micro_batch_rows / micro_batches), set rl.learner.remat=True, lower "
  "rl.loop.max_response_len / max_prompt_len, rl.loop.prompts_per_step (or "
  "rl.learner.ppo_mini_batch_size), or use more devices (mesh)",
  "sampling": "lower rl.loop.prompts_per_step, rl.loop.group_size or "
  "rl.loop.max_response_len, or sample from vLLM servers (sampler.kind=vllm)",
  "evaluation": "lower eval.sampling.batch_prompts, eval.sampling.max_tokens or eval.sampling.n",
  "SFT": "lower sft.batch_size, use more, smaller micro-batches (lower "
  "sft.learner.micro_memory_gb, or raise sft.learner.micro_batches), or use more devices (mesh)",
  None: "lower the batch and length settings of the phase that ran (rl.learner."
  "micro_batch_rows, rl.loop.max_response_len, rl.loop.prompts_per_step, "
  "eval.sampling.batch_prompts, sft.batch_size), or use more devices (mesh)",
}

_WHERE = {"RL update": "the RL update", "sampling": "sampling (the RL rollouts)"}
_BYTES = re.compile(r"allocat\w*\s+(\d+)\s*bytes")
_NUMPY = re.compile(r"allocate\s+([\d.]+\s*[KMGTP]i?B)")


def is_oom(exc: BaseException) -> bool:
  """XLA's RESOURCE_EXHAUSTED out-of-memory error, or a host `MemoryError`."""
  if isinstance(exc, MemoryError):
    return True
  import jax

  text = str(exc)
  return (
    isinstance(exc, jax.errors.JaxRuntimeError)
    and "RESOURCE_EXHAUSTED" in text
    and "out of memory" in text.lower()
  )


def phase_of(exc: BaseException) -> str | None:
  """The phase whose module is the outermost in the traceback, if any."""
  for frame, _ in traceback.walk_tb(exc.__traceback__):
    module = frame.f_globals.get("__name__", "")
    for prefix, phase in PHASE_MODULES.items():
      if module == prefix or module.startswith(prefix + "."):
        return phase
  return None


def requested(exc: BaseException) -> str | None:
  """The allocation that failed, e.g. "29.9 GiB", when the message says."""
  text = str(exc)
  m = _BYTES.search(text)
  if m:
    n = int(m.group(1))
    for unit, size in (("TiB", 1024 * GIB), ("GiB", GIB), ("MiB", 1024**2)):
      if n >= size or unit == "MiB":
        return f"{n / size:.1f} {unit}"
  m = _NUMPY.search(text) if isinstance(exc, MemoryError) else None  # numpy: "29.9 GiB"
  return m.group(1).replace(". ", " ") if m else None


def describe(
  exc: BaseException, phase: str | None = None, advice: str | None = None, plan: str | None = None
) -> str | None:
  """One line for an out-of-memory error (None for any other error).

  phase: where it ran out (default: from the traceback, `phase_of`); advice: what to
  lower (default: `ADVICE[phase]`, launch.train's config fields); plan: a command that
  tells before a run whether the RL update fits (named for the RL update only).
  """
  if not is_oom(exc):
    return None
  phase = phase or phase_of(exc)
  where = f" in {_WHERE.get(phase, phase)}" if phase else ""
  size = requested(exc)
  who = "XLA" if not isinstance(exc, MemoryError) else "the host"
  what = f" ({who} could not allocate {size})" if size else ""
  text = f"out of memory{where}{what}: {advice or ADVICE.get(phase, ADVICE[None])}"
  if plan and phase in ("RL update", None):
    text += f"; {plan} tells what fits before a run"
  return text


@contextlib.contextmanager
def reported(program: str, phase: str, advice: str):
  """Out of memory inside the block: `program: <describe(...)>` on stderr, exit 1; any
  other error passes through."""
  try:
    yield
  except Exception as e:  # noqa: BLE001 - only out of memory is caught, the rest re-raised
    line = describe(e, phase, advice)
    if line is None:
      raise
    sys.stderr.write(f"{program}: {line}\n")
    sys.exit(1)
