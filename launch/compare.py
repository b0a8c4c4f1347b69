r"""Runs side by side: their curves in one PNG and a table of their final figures.

  python -m launch.compare --runs=workdir/tiny_rlvr,workdir/tiny --out=compare.png
  python -m launch.compare --runs=A,B --keys=pass@1,reward_mean,accuracy,truncated_frac

Reads each run's metrics.jsonl and its evaluations before / after RL (summary.json, or
progress.json while it runs). Keys are metrics.jsonl names; `pass@1` is the held-out pass@1
of every eval set. A key missing from a run is left out of its curves with a note.
"""

import sys

from absl import app, flags

from rlvr.report import compare

FLAGS = flags.FLAGS
flags.DEFINE_list("runs", [], "Work dirs of the runs to compare (comma-separated).")
flags.DEFINE_list(
  "keys",
  list(compare.DEFAULT_KEYS),
  "metrics.jsonl keys to draw and tabulate; pass@1 = held-out pass@1 of every eval set.",
)
flags.DEFINE_string("out", "compare.png", "Where the PNG is written.")


def main(argv):
  del argv
  try:
    result = compare.compare(FLAGS.runs, FLAGS.keys, FLAGS.out)
  except (FileNotFoundError, ValueError) as e:
    sys.stderr.write(f"launch.compare: {' '.join(str(e).split())}\n")
    sys.exit(1)
  for note in result.notes:
    print(note)
  print(result.table)
  print(f"wrote {result.out}")


if __name__ == "__main__":
  app.run(main)
