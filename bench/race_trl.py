"""rlvr against TRL on one GRPO job, one after the other on this machine.

Both start from the same HF folder (default: SmolLM2-135M-Instruct from its GGUF file; give
a warm-started folder, e.g. a run's `sft/export`, with --model), take the same problems in
the same user turn (2-step arithmetic, the model's own chat template), the same reward
(bench/race_reward.py: the last \\boxed{} integer is the answer), group size, prompts per
step, max new tokens, temperature 1, learning rate (constant, AdamW b2 0.999, no weight
decay, grad clip 1), token-level loss with clip-higher (TRL's `loss_type="dapo"`,
epsilon 0.2 / epsilon_high 0.28; ours: `aggregation="token-mean"`, eps 0.2 / 0.28), no KL,
one optimizer step per batch, every group kept (no dynamic sampling), f32.

rlvr samples from a vLLM CPU server the run starts (`sampler.local_servers`) and pushes
weights each step; TRL generates with transformers (its vLLM "server" mode syncs weights
over NCCL, which needs CUDA; its "colocate" mode needs vLLM inside TRL's own environment,
where vLLM's CPU build pins another torch). Prints per step: generation s, update s, the
whole step, completion tokens per second of the step, mean reward, for both; then the ratio
of mean step times (steps after the first, which compiles) and each side's peak memory.

  bash scripts/setup.sh --trl   # TRL 1.16 in .venvs/trl
  python bench/race_trl.py [--steps=4] [--lora=16 [--lora_push=merged]] [--model=<HF folder>]
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import model_configs  # noqa: E402  (bench/: the FLOPs and the matmul peak)

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "smollm2-135m-instruct", "HF folder, GGUF file or short name.")
flags.DEFINE_integer("steps", 4, "RL steps on each side.")
flags.DEFINE_integer("prompts", 8, "Prompts per step.")
flags.DEFINE_integer("group", 4, "Responses per prompt.")
flags.DEFINE_integer("max_new_tokens", 64, "Longest response.")
flags.DEFINE_float("lr", 5e-6, "Learning rate (constant).")
flags.DEFINE_integer("lora", 0, "> 0: LoRA of this rank (alpha 2 x rank) on both sides.")
flags.DEFINE_enum(
  "lora_push",
  "adapters",
  ["adapters", "merged"],
  "With --lora, what rlvr pushes to its vLLM server each step: the adapters (vLLM applies "
  "them while it samples) or the weights with the adapters merged in.",
)
flags.DEFINE_enum(
  "dtype",
  "float32",
  ["float32", "bfloat16"],
  "The update's matmul dtype on both sides (weights and optimizer stay f32): ours "
  "`rl.learner.compute_dtype`, TRL's `bf16=True` (torch autocast).",
)
flags.DEFINE_integer("seed", 0, "Problems and sampling seed.")
flags.DEFINE_list(
  "rlvr_set",
  [],
  "More settings of rlvr's side, e.g. rl.learner.scan_layers=False (each becomes "
  "--config.<setting>).",
)
flags.DEFINE_string("workdir", "/tmp/race_trl", "Scratch folder (cleared per side).")
flags.DEFINE_enum("side", "both", ["both", "rlvr", "trl"], "Which sides to run.")
flags.DEFINE_string("trl_python", os.path.join(ROOT, ".venvs/trl/bin/python"), "TRL's Python.")

INSTRUCTION = "Give the final answer as \\boxed{number}."


def write_problems(path: str, n: int, seed: int) -> None:
  """n problems of configs/smollm2_arith.py's task (operands 0..9, 2 operations), the
  instruction in the user turn, as JSONL rows {problem, answer}."""
  from rlvr.data.tasks import arithmetic

  problems, _ = arithmetic.make_splits(n, 0, seed=seed, max_operand=9)
  with open(path, "w") as f:
    for p in problems:
      f.write(json.dumps({"problem": f"{p.problem} {INSTRUCTION}", "answer": p.answer}) + "\n")


def run_rlvr(model: str, problems: str, out: str) -> tuple[list[dict], float]:
  """rlvr's launch.train on the job: (per-step rows, peak GiB of the trainer process)."""
  sets = [
    "--config=configs/smollm2_arith.py",
    f"--config.workdir={out}",
    f"--config.model.path={model}",
    "--config.sft.steps=0",
    f"--config.rl.steps={FLAGS.steps}",
    f"--config.rl.loop.prompts_per_step={FLAGS.prompts}",
    f"--config.rl.loop.group_size={FLAGS.group}",
    f"--config.rl.loop.max_response_len={FLAGS.max_new_tokens}",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.rl.loop.max_extra_rounds=0",
    f"--config.seed={FLAGS.seed}",
    f"--config.rl.learner.learning_rate={FLAGS.lr}",
    "--config.rl.learner.b2=0.999",
    "--config.rl.learner.dual_clip=1e9",  # no dual clip, as TRL (the field takes a number)
    "--config.data.kind=files",
    "--config.data.arithmetic.n_sft=0",  # the config's procedural task, cleared
    "--config.data.arithmetic.n_train=0",
    "--config.data.arithmetic.n_heldout=0",
    f"--config.data.train_path={problems}",
    f"--config.data.eval_paths=('{problems}',)",
    "--config.data.eval_limit=8",
    "--config.data.instruction=",
    "--config.reward.domain=bench.race_reward:score",
    "--config.eval.sampling.n=1",
    f"--config.checkpoint.every={FLAGS.steps}",
    "--config.export_hf=False",
    f"--config.rl.learner.compute_dtype={FLAGS.dtype}",
  ]
  if FLAGS.lora:
    sets += [
      f"--config.rl.learner.lora.rank={FLAGS.lora}",
      f"--config.rl.learner.lora.alpha={2.0 * FLAGS.lora}",
      "--config.rl.learner.lora.dropout=0.0",
      f"--config.sampler.lora_adapters={FLAGS.lora_push == 'adapters'}",
    ]
  sets += [f"--config.{x}" for x in FLAGS.rlvr_set]
  cmd = ["/usr/bin/time", "-f", "PEAK_KB %M", sys.executable, "-m", "launch.train", *sets]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if done.returncode:
    sys.exit(f"rlvr side failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  peak = [line for line in done.stderr.splitlines() if line.startswith("PEAK_KB")]
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  steps = [r for r in rows if "time_step" in r]
  return [
    {
      "step": r["step"],
      "step_s": r["time_step"],
      "generate_s": r["time_sample"],
      "update_s": r["time_update"],
      "tokens": r["tokens_per_s"] * r["time_step"],
      "reward": r["reward_mean"],
    }
    for r in steps
  ], int(peak[-1].split()[1]) / 2**20


def run_trl(model: str, problems: str, out: str) -> tuple[list[dict], float]:
  """TRL's GRPOTrainer on the job (bench/trl_worker.py in TRL's environment)."""
  if not os.path.exists(FLAGS.trl_python):
    sys.exit(f"--trl_python {FLAGS.trl_python} not found: bash scripts/setup.sh --trl")
  settings = {
    "model": model,
    "problems": problems,
    "out": out,
    "steps": FLAGS.steps,
    "prompts": FLAGS.prompts,
    "group": FLAGS.group,
    "max_new_tokens": FLAGS.max_new_tokens,
    "lr": FLAGS.lr,
    "lora": FLAGS.lora,
    "seed": FLAGS.seed,
    "bf16": FLAGS.dtype == "bfloat16",
  }
  worker = os.path.join(ROOT, "bench", "trl_worker.py")
  done = subprocess.run(
    [FLAGS.trl_python, worker, json.dumps(settings)], cwd=ROOT, capture_output=True, text=True
  )
  lines = [json.loads(x[5:]) for x in done.stdout.splitlines() if x.startswith("RACE ")]
  if done.returncode or not lines:
    sys.exit(f"TRL side failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  return [x for x in lines if "step" in x], lines[-1].get("peak_gib", float("nan"))


def show(name: str, rows: list[dict]) -> None:
  for r in rows:
    print(
      f"{name:5s} step {r['step']:2d}: generate {r['generate_s']:6.1f} s, update "
      f"{r['update_s']:6.1f} s, step {r['step_s']:6.1f} s, "
      f"{r['tokens'] / max(r['step_s'], 1e-9):6.1f} tokens/s, reward {r['reward']:.3f}",
      flush=True,
    )


def mean_after_first(rows: list[dict], key: str) -> float:
  kept = rows[1:] or rows
  return sum(r[key] for r in kept) / len(kept)


def update_flops(model: str, problems: str, rows: list[dict]) -> float:
  """Model FLOPs of one update on a step of these rows: 6 x the matmul parameters a token
  uses (LM head included) x the tokens of the batch (every prompt in the model's chat
  template, once per response, plus the step's completion tokens), attention included."""
  from transformers import AutoTokenizer

  from rlvr.model import config as model_config

  cfg = model_config.ModelConfig.from_hf(model)
  tok = AutoTokenizer.from_pretrained(model)
  lens = []
  for line in open(problems):
    turn = [{"role": "user", "content": json.loads(line)["problem"]}]
    text = tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    lens.append(len(tok(text, add_special_tokens=False)["input_ids"]))
  completion = mean_after_first(rows, "tokens")
  tokens = sum(lens) / len(lens) * FLAGS.prompts * FLAGS.group + completion
  seq = tokens / (FLAGS.prompts * FLAGS.group)
  return model_configs.model_flops_per_token(cfg, int(seq)) * tokens


def matmul_peak() -> float:
  """This process's best FLOP/s on square matmuls of the update's dtype."""
  import jax.numpy as jnp

  return model_configs.matmul_peak(jnp.dtype(FLAGS.dtype))


def main(_):
  from rlvr.run import workdir

  model = workdir.resolve_model(FLAGS.model, "--model")
  os.makedirs(FLAGS.workdir, exist_ok=True)
  problems = os.path.join(FLAGS.workdir, "problems.jsonl")
  write_problems(problems, FLAGS.steps * FLAGS.prompts, FLAGS.seed)
  random.seed(FLAGS.seed)
  print(
    f"race: {model}, {FLAGS.steps} steps x {FLAGS.prompts} prompts x {FLAGS.group} responses, "
    f"{FLAGS.max_new_tokens} new tokens, lr {FLAGS.lr}"
    + (
      f", LoRA rank {FLAGS.lora} ({FLAGS.lora_push} pushed)" if FLAGS.lora else ", full fine-tuning"
    ),
    flush=True,
  )
  results = {}
  for side, fn in (("rlvr", run_rlvr), ("trl", run_trl)):
    if FLAGS.side not in ("both", side):
      continue
    out = os.path.join(FLAGS.workdir, side)
    subprocess.run(["rm", "-rf", out], check=True)
    t = time.perf_counter()
    rows, peak = fn(model, problems, out)
    results[side] = rows, peak
    show(side, rows)
    print(f"{side}: {time.perf_counter() - t:.0f} s in all, peak {peak:.2f} GiB", flush=True)
  if len(results) == 2:
    (ours, our_peak), (theirs, their_peak) = results["rlvr"], results["trl"]
    print("\nmean over steps after the first (rlvr / TRL, > 1: rlvr faster):")
    for key in ("step_s", "generate_s", "update_s"):
      a, b = mean_after_first(ours, key), mean_after_first(theirs, key)
      print(f"  {key:10s} rlvr {a:6.1f} s, TRL {b:6.1f} s: rlvr {b / a:.2f}x")
    a, b = mean_after_first(ours, "reward"), mean_after_first(theirs, "reward")
    print(f"  reward     rlvr {a:.3f}, TRL {b:.3f}")
    print(f"  peak       rlvr {our_peak:.2f} GiB, TRL {their_peak:.2f} GiB")
    if not FLAGS.lora:
      flops, peak = update_flops(model, problems, ours), matmul_peak()
      print(
        f"  update     {flops / 1e12:.2f} TFLOP a step; {FLAGS.dtype} matmul peak measured "
        f"here {peak / 1e9:.0f} GFLOP/s, so no update is shorter than {flops / peak:.1f} s: "
        f"rlvr at {flops / mean_after_first(ours, 'update_s') / peak:.0%} of it, TRL at "
        f"{flops / mean_after_first(theirs, 'update_s') / peak:.0%}"
      )


if __name__ == "__main__":
  app.run(main)
