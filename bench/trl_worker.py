"""The TRL side of bench/race_trl.py, run in the TRL environment (.venvs/trl,
`bash scripts/setup.sh --trl`): `GRPOTrainer` on the race's problems, printing one JSON line
per step (generation, scoring and update seconds, completion tokens, mean reward) and one
with the process's peak memory.

  .venvs/trl/bin/python bench/trl_worker.py '<settings as JSON>'
"""

import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import race_reward  # noqa: E402


def main(s: dict) -> None:
  import torch
  from datasets import Dataset
  from transformers import AutoTokenizer, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  torch.manual_seed(s["seed"])
  torch.set_num_threads(os.cpu_count() or 1)
  rows = [json.loads(line) for line in open(s["problems"])]
  data = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": r["problem"]}], "answer": r["answer"]} for r in rows]
  )
  batch = s["prompts"] * s["group"]
  args = GRPOConfig(
    output_dir=s["out"],
    use_cpu=True,
    bf16=s.get("bf16", False),  # torch autocast to bf16 on CPU
    learning_rate=s["lr"],
    lr_scheduler_type="constant",
    weight_decay=0.0,
    adam_beta2=0.999,
    max_grad_norm=1.0,
    per_device_train_batch_size=batch,
    gradient_accumulation_steps=1,
    num_generations=s["group"],
    generation_batch_size=batch,
    max_completion_length=s["max_new_tokens"],
    temperature=1.0,
    top_p=1.0,
    loss_type="dapo",  # token-level loss
    epsilon=0.2,
    epsilon_high=0.28,  # clip-higher
    beta=0.0,
    num_iterations=1,
    scale_rewards="group",
    max_steps=s["steps"],
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    shuffle_dataset=False,
    seed=s["seed"],
    disable_tqdm=True,
  )
  peft_config = None
  if s["lora"]:
    from peft import LoraConfig

    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_config = LoraConfig(
      r=s["lora"], lora_alpha=2 * s["lora"], lora_dropout=0.0, target_modules=modules
    )
  trainer = GRPOTrainer(
    model=s["model"],
    reward_funcs=race_reward.trl_reward,
    args=args,
    train_dataset=data,
    processing_class=AutoTokenizer.from_pretrained(s["model"]),
    peft_config=peft_config,
  )
  times = {"generate": 0.0, "score": 0.0, "tokens": 0}
  generate, generate_and_score = trainer._generate, trainer._generate_and_score_completions

  def timed_generate(*a, **k):
    t = time.perf_counter()
    out = generate(*a, **k)
    times["generate"] += time.perf_counter() - t
    return out

  def timed_generate_and_score(*a, **k):
    t = time.perf_counter()
    out = generate_and_score(*a, **k)
    times["score"] += time.perf_counter() - t
    times["tokens"] += int(out["completion_mask"].sum())
    return out

  trainer._generate, trainer._generate_and_score_completions = (
    timed_generate,
    timed_generate_and_score,
  )

  class PerStep(TrainerCallback):
    def on_step_begin(self, *_, **__):
      times.update(generate=0.0, score=0.0, tokens=0, start=time.perf_counter())

    def on_step_end(self, *_, **__):  # before the step's on_log
      times["step_s"] = time.perf_counter() - times["start"]

    def on_log(self, _args, state, _control, logs=None, **__):
      if logs is None or "reward" not in logs:
        return
      row = {
        "step": state.global_step,
        "step_s": times["step_s"],
        "generate_s": times["generate"],
        "update_s": times["step_s"] - times["score"],
        "tokens": times["tokens"],
        "reward": logs["reward"],
      }
      print("RACE " + json.dumps(row), flush=True)

  trainer.add_callback(PerStep())
  trainer.train()
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  print("RACE " + json.dumps({"peak_gib": rss}), flush=True)


if __name__ == "__main__":
  main(json.loads(sys.argv[1]))
