"""Plain GRPO at embedded scale: a ~0.6M-parameter model learns 2-step arithmetic.

SFT sees a small fixed set of worked solutions (as QbQ's M0 does); GRPO then
sees many more problems with answers only, so RL adds what SFT cannot. Runs
end to end (make_tiny, SFT, eval, GRPO with JaxSampler, eval) in about 6
minutes on 2 CPU cores. The embedded default (configs/tiny.py) is this plus SvS.

  python -m launch.train --config=configs/tiny_rlvr.py
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "workdir/tiny_rlvr"
  c.reward_workers = 2
  c.model.tiny = {  # make_tiny overrides (head size 32 for vLLM CPU)
    "seed": 0,
    "hidden_size": 128,
    "num_layers": 3,
    "num_heads": 4,
    "num_kv_heads": 4,
    "head_dim": 32,
    "intermediate_size": 384,
    "tie_word_embeddings": True,
  }
  c.data.kind = "arithmetic"
  c.data.instruction = ""  # SFT teaches the format; keeps prompts short
  c.data.arithmetic.max_operand = 9  # 2 operations on operands 0..9
  c.data.arithmetic.n_sft = 500  # worked solutions seen by SFT
  c.data.arithmetic.n_train = 4000  # answer-only problems for GRPO
  c.data.arithmetic.n_heldout = 256  # fixed held-out split
  c.sft.steps = 400
  c.sft.batch_size = 32
  c.sft.learner.learning_rate = 3e-3
  c.sft.learner.lr_schedule = "cosine"
  c.sft.learner.warmup_steps = 20
  c.sft.learner.min_lr_ratio = 0.1
  c.rl.steps = 100
  c.rl.loop.prompts_per_step = 16
  c.rl.loop.max_prompt_len = 24
  c.rl.loop.max_response_len = 40
  c.rl.loop.max_extra_rounds = 2
  c.rl.learner.ppo_mini_batch_size = 16  # as the papers: one step per plain batch, several
  # for an SvS buffer (types 1+2+3)
  c.rl.learner.learning_rate = 2e-4
  c.rl.learner.weight_decay = 0.0
  c.rl.learner.b2 = 0.99
  c.reward.integer_answers = True
  c.eval.sampling.n = 4
  c.eval.sampling.max_tokens = 40
  c.eval.sampling.batch_prompts = 128
  c.checkpoint.every = 10
  c.checkpoint.keep = 2
  return c
