r"""Composition-RL data: composed problems built by an assistant LLM behind a server.

  python -m launch.compose --source=data/math.parquet --out=data/composed_d2.jsonl \
      --depth=2 --n=240000 --url=http://127.0.0.1:8000 --model=policy
  python -m launch.compose --source=data/physics.jsonl --second_source=data/math.jsonl \
      --out=data/physics_math.jsonl --n=10000 --url=http://127.0.0.1:8000   # cross-domain

The plan is drawn up front from --seed (docs/methods.md#depth-and-surrogate-pools), each
chain composed by `synthesis.composition.compose` through the assistant; the
plan is `rlvr.run.composition_plan`'s, the resumable output files (OUT,
OUT.rejected.jsonl, OUT.plan.json) and the yield funnel (OUT.report.json)
`rlvr.run.composition_build`'s. Rerunning the same
command skips the ids already finished and composes the rest; a larger --n
extends the same plan. --api_key (default: $VLLM_API_KEY) is sent as a bearer
token, as `launch.serve_vllm --api_key` requires.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from rlvr.run import composition_build as compose_run
from rlvr.run import composition_plan
from rlvr.sampling.assistant import Assistant
from rlvr.sampling.http import API_KEY_ENV, short_error

FLAGS = flags.FLAGS
flags.DEFINE_string("source", None, "Problems with answers (parquet/jsonl/json).")
flags.DEFINE_string(
  "second_source",
  None,
  "Cross-domain: q_K (and the answer) from this set, q1..q_{K-1} from --source.",
)
flags.DEFINE_string("out", None, "Output .jsonl of accepted compositions.")
flags.DEFINE_integer("depth", 2, "K: problems per composition (>= 2).")
flags.DEFINE_integer("n", 1000, "Compositions to attempt (the plan's size).")
flags.DEFINE_integer("pool_size", 20, "Surrogate pool size for positions 1..K-1 (paper: 20).")
flags.DEFINE_integer("seed", 0, "Seed of the plan (pools and chains).")
flags.DEFINE_string("url", None, "OpenAI-compatible server, e.g. http://127.0.0.1:8000.")
flags.DEFINE_string("model", "policy", "Served model name.")
flags.DEFINE_string("api_key", None, f"Bearer token (default: ${API_KEY_ENV}).")
flags.DEFINE_float("temperature", 0.1, "Assistant sampling temperature (paper: 0.1).")
flags.DEFINE_float("top_p", 0.7, "Assistant nucleus sampling (paper: 0.7).")
flags.DEFINE_integer("max_tokens", 4096, "Assistant response length limit.")
flags.DEFINE_integer("concurrency", 16, "Compositions (so requests) in flight at once.")
flags.DEFINE_float("timeout_s", 600.0, "Per-request timeout in seconds.")
flags.DEFINE_integer(
  "retries",
  3,
  "Retries of a request that failed (connection, timeout, "
  "HTTP 408/429/5xx, aborted), with capped exponential backoff.",
)


def _fail(message: str, code: int = 2):
  sys.stderr.write(f"launch.compose: {message}\n")
  sys.exit(code)


def parse_flags(argv):
  """absl parsing with a bad flag reported in one line (exit 2)."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    _fail(" ".join(str(e).split()))


def _check_flags() -> None:
  if not FLAGS.source:
    _fail("--source is required (a parquet/jsonl/json file of problems with answers)")
  if not FLAGS.out or not FLAGS.out.endswith(".jsonl"):
    _fail(f"--out must be a .jsonl path, got {FLAGS.out!r}")
  if not FLAGS.url or not FLAGS.url.startswith(("http://", "https://")):
    _fail(f"--url must be an http(s) server address, got {FLAGS.url!r}")
  checks = [
    ("depth", FLAGS.depth >= 2, ">= 2"),
    ("n", FLAGS.n >= 1, ">= 1"),
    ("pool_size", FLAGS.pool_size >= 1, ">= 1"),
    ("concurrency", FLAGS.concurrency >= 1, ">= 1"),
    ("timeout_s", FLAGS.timeout_s > 0, "> 0"),
    ("retries", FLAGS.retries >= 0, ">= 0"),
    ("temperature", FLAGS.temperature >= 0, ">= 0"),
    ("top_p", 0 < FLAGS.top_p <= 1, "in (0, 1]"),
    ("max_tokens", FLAGS.max_tokens >= 1, ">= 1"),
  ]
  for name, ok, want in checks:
    if not ok:
      _fail(f"--{name} must be {want}, got {FLAGS[name].value}")


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}")
  _check_flags()
  from rlvr.data.raw_rows import DatasetError

  try:
    first, second = composition_plan.load_sources(FLAGS.source, FLAGS.second_source)
  except (DatasetError, OSError, ValueError, ImportError) as e:
    _fail(f"cannot read the source: {short_error(e)}")
  try:
    plan = composition_plan.prepare(
      FLAGS.out,
      first,
      second,
      source=FLAGS.source,
      second_source=FLAGS.second_source,
      depth=FLAGS.depth,
      n=FLAGS.n,
      pool_size=FLAGS.pool_size,
      seed=FLAGS.seed,
    )
  except ValueError as e:
    _fail(short_error(e))
  assistant = Assistant(
    FLAGS.url,
    FLAGS.model,
    api_key=FLAGS.api_key,
    temperature=FLAGS.temperature,
    top_p=FLAGS.top_p,
    max_tokens=FLAGS.max_tokens,
    timeout_s=FLAGS.timeout_s,
    retries=FLAGS.retries,
    concurrency=FLAGS.concurrency,
  )
  report, error = compose_run.run_and_report(
    plan, FLAGS.out, assistant, FLAGS.concurrency, FLAGS.depth
  )
  out = FLAGS.out
  print(compose_run.format_report(report))
  print(
    f"accepted: {out}\nrejected: {compose_run.rejected_path(out)}\n"
    f"report: {out}.report.json\nplan: {out}.plan.json"
  )
  if error:
    sys.stdout.flush()
    sys.stderr.write(
      f"launch.compose: {error}; finished rows are saved, rerun the same command to continue\n"
    )
    sys.stderr.flush()
    os._exit(1)  # threads may still wait on a hung server: do not join them


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
