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
  c.model.tiny = {                      # make_tiny overrides (head size 32 for vLLM CPU)
      "seed": 0, "hidden_size": 128, "num_layers": 3, "num_heads": 4, "num_kv_heads": 4,
      "head_dim": 32, "intermediate_size": 384, "tie_word_embeddings": True,
  }
  c.data.kind = "arithmetic"
  c.data.instruction = ""               # SFT teaches the format; keeps prompts short
  c.data.arithmetic = {
      "difficulty": 1,                  # 2 operations
      "max_operand": 9,                 # operands 0..9
      "n_sft": 500,                     # worked solutions seen by SFT
      "n_train": 4000,                  # answer-only problems for GRPO
      "n_heldout": 256,                 # fixed held-out split
      "inverse_pairs": False,           # also teach solution -> problem (SvS synthesis)
  }
  c.sft.steps = 400
  c.sft.batch_size = 32
  c.sft.learner = {"learning_rate": 3e-3, "weight_decay": 0.0, "grad_clip": 1.0,
                   "dual_clip": None, "lr_schedule": "cosine", "warmup_steps": 20,
                   "total_steps": 400, "min_lr_ratio": 0.1}
  c.rl.steps = 100
  c.rl.loop = {"prompts_per_step": 16, "group_size": 8, "max_prompt_len": 24,
               "max_response_len": 40, "temperature": 1.0, "dynamic_sampling": True,
               "max_extra_rounds": 2, "oversample": 2.0}
  c.rl.learner = {"learning_rate": 2e-4, "weight_decay": 0.0, "grad_clip": 1.0,
                  "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0,
                  "aggregation": "token-mean", "b2": 0.99}
  c.reward = {"extraction": "boxed", "integer_answers": True, "format_bonus": 0.0,
              "timeout_s": 5.0}
  c.eval.sampling = {"n": 4, "seeds": (0,), "temperature": 1.0, "max_tokens": 40,
                     "batch_prompts": 128}
  c.checkpoint = {"every": 10, "keep": 2}
  return c
