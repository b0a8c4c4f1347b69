r"""Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only.

  python -m launch.sft --model=DIR --data=pairs.jsonl --workdir=workdir/sft --steps=500
  python -m launch.sft --model=DIR --data=arithmetic --steps=400      # procedural task
  python -m launch.sft --model=DIR --data=m0_solutions.jsonl --lora_rank=32 --epochs=3 \
      --learning_rate=1e-5 --warmup_ratio=0.03                        # QbQ's M0 (merged)

--data rows need a problem/prompt field and a solution/completion field
(--problem_field / --completion_field). Uses the learner's sharded update and
orbax checkpoints (rerun to resume); writes the result as an HF dir workdir/model.
Defaults are those of launch.train's `sft` section (`sections.SFTConfig`: batch size,
learning rate, weight decay, LoRA); the schedule here is warmup + cosine over the steps.
"""

import dataclasses
import math
import os

from absl import app, flags, logging

from rlvr.run.sections import SFTConfig

SECTION = SFTConfig()  # the defaults of launch.train's sft section, one source for both
FLAGS = flags.FLAGS
flags.DEFINE_string(
  "model", None, "HF model directory, hub id or GGUF file to start from.", required=True
)
flags.DEFINE_string("data", None, "jsonl/json/parquet pairs, or 'arithmetic'.", required=True)
flags.DEFINE_string("workdir", "workdir/sft", "Output directory.")
flags.DEFINE_string("problem_field", "prompt", "Prompt column (chat-templated).")
flags.DEFINE_string("completion_field", "completion", "Completion column.")
flags.DEFINE_string("instruction", "", "Appended to each prompt.")
flags.DEFINE_string(
  "chat_template",
  "",
  "Prompt template: '' (the tokenizer's), 'none' (raw text), 'chatml', or a Jinja file.",
)
flags.DEFINE_integer("steps", 500, "Optimizer steps (unless --epochs).")
flags.DEFINE_float("epochs", 0.0, "Passes over the pairs instead of --steps (QbQ's M0: 3).")
flags.DEFINE_float(
  "warmup_ratio",
  -1.0,
  "Warmup as a fraction of the steps (QbQ's M0: 0.03); default min(50, steps / 10).",
)
flags.DEFINE_integer("batch_size", SECTION.batch_size, "Pairs per step (sft.batch_size).")
flags.DEFINE_float(
  "learning_rate",
  SECTION.learner.learning_rate,
  "Peak learning rate, warmup + cosine (sft.learner.learning_rate).",
)
flags.DEFINE_string("mesh", "fsdp=-1", "Mesh axes, e.g. data=2,fsdp=4.")
flags.DEFINE_integer("seed", 0, "Shuffling seed.")
flags.DEFINE_integer(
  "lora_rank", SECTION.learner.lora.rank, "LoRA rank (0 = full fine-tuning); written merged."
)
flags.DEFINE_float("lora_alpha", SECTION.learner.lora.alpha, "LoRA alpha (scale alpha / rank).")
flags.DEFINE_float(
  "lora_dropout",
  SECTION.learner.lora.dropout,
  "LoRA dropout (rows of A, per step; rlvr/model/lora.py).",
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines drown the progress bars
  from rlvr.parallel import sharding
  from rlvr.run.sft import train_sft

  if FLAGS.data == "arithmetic":
    from rlvr.data.tasks import arithmetic

    train, _ = arithmetic.make_splits(1000, 0, 1, FLAGS.seed)
    pairs = [(p.problem, p.solution) for p in train]
  else:
    from rlvr.data.readers import read_dataset

    ds = read_dataset(
      FLAGS.data, problem_field=FLAGS.problem_field, answer_field=FLAGS.completion_field
    )
    pairs = [(e.problem, e.answer) for e in ds]
  steps = FLAGS.steps
  if FLAGS.epochs > 0:
    steps = max(1, math.ceil(FLAGS.epochs * len(pairs) / FLAGS.batch_size))
  warmup = min(50, steps // 10) if FLAGS.warmup_ratio < 0 else math.ceil(FLAGS.warmup_ratio * steps)
  mesh = sharding.make_mesh({k: int(v) for k, v in (p.split("=") for p in FLAGS.mesh.split(","))})
  lc = dataclasses.replace(
    SECTION.learner,
    learning_rate=FLAGS.learning_rate,
    lr_schedule="cosine",
    warmup_steps=warmup,
    total_steps=steps,
    lora=dataclasses.replace(
      SECTION.learner.lora,
      rank=FLAGS.lora_rank,
      alpha=FLAGS.lora_alpha,
      dropout=FLAGS.lora_dropout,
    ),
  )
  from rlvr.run.workdir import resolve_model

  try:
    model_dir = resolve_model(FLAGS.model, "--model")
  except (FileNotFoundError, ValueError) as e:  # a bad path or GGUF file: one line
    raise app.UsageError(str(e)) from None
  from rlvr.run import oom

  with oom.reported("launch.sft", "SFT", "lower --batch_size, or use more devices (--mesh)"):
    out = train_sft(
      model_dir,
      pairs,
      FLAGS.workdir,
      learner_cfg=lc,
      mesh=mesh,
      instruction=FLAGS.instruction,
      chat_template=FLAGS.chat_template,
      steps=steps,
      batch_size=FLAGS.batch_size,
      seed=FLAGS.seed,
    )
  print(
    f"SFT model written to {out} (metrics.jsonl and checkpoints in "
    f"{os.path.abspath(FLAGS.workdir)})"
  )


if __name__ == "__main__":
  app.run(main)
