"""QbQ on AIME as the paper ran it: Qwen2.5-Math-7B, 20 rounds of 150 GRPO steps.

docs/methods.md#qbq-settings and the paper's Table 3: solve counts of k = 16 samples
(temperature 0.7, top_p 0.8, top_k 20, repetition penalty 1.05, 3,072 tokens); seeds
from the mostly-right band 8..15; 3 operators per seed; SelectRL with N = 300; per
round one pass of 150 steps x 2 problems, m = 8 completions at temperature 1.0,
reward = correct + 0.1 for a boxed integer, standardised in the group,
seq-mean-token-mean loss over all m completions with truncated ones masked,
clip 0.2 both sides, no KL, AdamW lr 3e-6 constant, betas (0.9, 0.99),
grad-norm clip 0.2, bf16, a fresh optimizer every round. Held-out: AIME 2025
(data/aime2025.jsonl; the paper adds AIME 2026, which we do not have), 16 samples at
temperature 0.7, top_p 0.8, 3,072 tokens, after every round.
M0 (LoRA r 32 / alpha 64 / dropout 0.05 on all linear layers, 3 epochs, lr 1e-5 cosine,
warmup 3%, merged) on one teacher solution per pool problem is its own run:
  python -m launch.sft --model=/path/to/Qwen2.5-Math-7B --data=m0_solutions.jsonl \
      --lora_rank=32 --lora_alpha=64 --lora_dropout=0.05 --epochs=3 --learning_rate=1e-5 \
      --warmup_ratio=0.03 --workdir=runs/qbq_m0
then --config.model.path=runs/qbq_m0/model.
Ablations: --config.qbq.seed_band=sometimes|mixed; --config.qbq.schedule=shuffled
--config.qbq.replay_from=runs/qbq_aime_qwen25_math_7b (no curriculum);
--config.qbq.schedule=static (real plus synthetic).

  python -m launch.train --config=configs/qbq_aime_qwen25_math_7b.py \\
      --config.model.path=/path/to/M0 --config.data.train_path=/path/to/aime_1983_2024.jsonl \\
      --config.qbq.teacher=http://10.0.0.9:8000 --config.qbq.teacher_model=teacher \\
      --config.sampler.urls=http://10.0.0.2:8000
"""

import os

from ml_collections.config_dict import placeholder

from configs import base

AIME_2025 = os.path.join(os.path.dirname(base.EVAL_SET), "aime2025.jsonl")


def get_config():
  c = base.paper(
    "qbq_aime_qwen25_math_7b", steps=20 * 150, method="qbq", integer_answers=True, fsdp=8
  )
  c.data.eval_paths = [AIME_2025]
  c.qbq.rounds = 20
  c.qbq.steps_per_round = 150
  c.qbq.integer_answers = True
  c.qbq.teacher = ""  # required: URL of the teacher's server
  c.qbq.teacher_model = "teacher"
  c.qbq.teacher_max_tokens = 8192
  c.rl.loop.prompts_per_step = 2
  c.rl.loop.group_size = 8
  c.rl.loop.dynamic_sampling = False  # TRL's GRPO: every group enters the loss
  c.rl.learner.ppo_mini_batch_size = 0  # one optimizer step per 2 problems
  c.rl.loop.max_prompt_len = 1024  # 4,096 context = prompt + 3,072
  c.rl.loop.max_response_len = 3072
  c.rl.learner.learning_rate = 3e-6
  c.rl.learner.weight_decay = 0.0
  c.rl.learner.b2 = 0.99
  c.rl.learner.grad_clip = 0.2
  c.rl.learner.eps_low = 0.2
  c.rl.learner.eps_high = 0.2
  c.rl.learner.dual_clip = placeholder(float)  # None: no dual clip (TRL's GRPO)
  c.rl.learner.aggregation = "seq-mean-token-mean"
  c.rl.learner.mask_truncated = True
  c.rl.learner.normalize_all = True
  c.shaping.format_bonus = 0.1
  c.eval.every = 150  # held-out pass@1 after every round
  c.eval.sampling.n = 16
  c.eval.sampling.temperature = 0.7
  c.eval.sampling.top_p = 0.8
  c.eval.sampling.top_k = 0
  c.eval.sampling.max_tokens = 3072
  c.checkpoint.every = 50  # divides the round: resumes at a round boundary
  return c
