r"""Diversity of a QbQ run's problems per round, with a model's embeddings.

  python -m launch.qbq_diversity --run=workdir/tiny_qbq [--model=DIR] [--q=1]

Vendi score (`synthesis.diversity`, order --q) of each round's accepted variants and of
its selection R_t, embedded as the mean-pooled final hidden states of --model (default:
the run's exported policy, `<run>/policy`; any HF dir of our model families), plus the
model-free trigram score the run logged. Writes <run>/qbq/diversity.json and
diversity.png. The paper embeds with Qwen3-Embedding-8B: pass such a model's
numbers only next to numbers from the same model.
"""

from __future__ import annotations

import glob
import json
import os
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("run", None, "Work dir of a finished (or running) QbQ run.", required=True)
flags.DEFINE_string(
  "model", "", "HF dir whose hidden states embed the problems (default: <run>/policy)."
)
flags.DEFINE_float("q", 1.0, "Vendi order (1: the paper's; inf: 1 / largest eigenvalue).")


def _problems(path: str, accepted_only: bool) -> list[str]:
  from rlvr.common import fileio

  rows = fileio.read_jsonl(path)
  return [r["problem"] for r in rows if not accepted_only or r.get("reason") == "accepted"]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  rounds = sorted(glob.glob(os.path.join(FLAGS.run, "qbq", "round_*")))
  if not rounds:
    sys.stderr.write(f"launch.qbq_diversity: no qbq/round_* under {FLAGS.run}\n")
    sys.exit(2)
  model_dir = FLAGS.model or os.path.join(FLAGS.run, "policy")
  if not os.path.exists(os.path.join(model_dir, "config.json")):
    sys.stderr.write(f"launch.qbq_diversity: no HF model at {model_dir}; pass --model\n")
    sys.exit(2)
  from transformers import AutoTokenizer

  from rlvr import model as model_lib
  from rlvr.model.embed import embedder
  from synthesis import diversity

  cfg, params = model_lib.load_hf(model_dir)
  embed = embedder(params, cfg, AutoTokenizer.from_pretrained(model_dir))
  out = []
  for d in rounds:
    row = {"round": int(d.rsplit("_", 1)[1])}
    for name, file, accepted in (
      ("variants", "variants.jsonl", True),
      ("selection", "selection.jsonl", False),
    ):
      path = os.path.join(d, file)
      texts = _problems(path, accepted) if os.path.exists(path) else []
      row[f"{name}_n"] = len(texts)
      row[f"{name}_vendi"] = diversity.pool_vendi(texts, embed, FLAGS.q) if texts else None
    summary = os.path.join(d, "round.jsonl")
    if os.path.exists(summary):
      with open(summary) as f:
        row["variants_vendi_trigrams"] = json.loads(f.readline()).get("vendi")
    out.append(row)
    print(json.dumps(row))
  out_dir = os.path.abspath(os.path.join(FLAGS.run, "qbq"))
  with open(os.path.join(out_dir, "diversity.json"), "w") as f:
    json.dump({"model": model_dir, "q": FLAGS.q, "rounds": out}, f, indent=2)

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 3.4))
  for key, label in (
    ("variants_vendi", "variants (model)"),
    ("selection_vendi", "selection (model)"),
    ("variants_vendi_trigrams", "variants (trigrams)"),
  ):
    pts = [(r["round"], r[key]) for r in out if r.get(key) is not None]
    if pts:
      ax.plot(*zip(*pts), marker="o", label=label)
  ax.set_xlabel("round")
  ax.set_title(f"Vendi score (q={FLAGS.q:g})")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "diversity.png"), dpi=110)
  print(f"wrote diversity.json and diversity.png to {out_dir}")


if __name__ == "__main__":
  app.run(main)
