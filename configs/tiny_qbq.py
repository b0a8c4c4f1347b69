"""QbQ at embedded scale: two rounds on the arithmetic task, procedural teacher.

The arithmetic policy of configs/tiny_rlvr.py, SFT'd on 2- and 3-operation worked
solutions, then QbQ rounds
(`rlvr.methods.qbq`): solve counts of k = 8 samples over a 96-problem pool, seeds
from the mostly-right band (4..7 of 8), three operator-like variants per seed with
exact answers (`rlvr.data.tasks.variants`), SelectRL with N = 32, one pass of 8 steps x 4
problems per round with a fresh optimizer, held-out pass@k after every round.
Stage artifacts per round under workdir/qbq/round_XX/.

  python -m launch.train --config=configs/tiny_qbq.py
"""

from ml_collections.config_dict import placeholder

from configs import tiny_rlvr


def get_config():
  c = tiny_rlvr.get_config()
  c.workdir = "workdir/tiny_qbq"
  c.method = "qbq"
  c.data.arithmetic.n_train = 96  # the real pool S_0 is drawn from
  c.data.arithmetic.n_heldout = 128
  c.data.arithmetic.sft_difficulties = (2,)  # 3-operation solutions too: O5 adds a step
  c.rl.loop.max_response_len = 56  # 3-operation solutions
  c.eval.sampling.max_tokens = 56
  c.qbq.rounds = 2
  c.qbq.steps_per_round = 8
  c.qbq.k = 8
  c.qbq.initial_seeds = 0  # the whole band
  c.qbq.select_n = 32
  c.qbq.teacher = "procedural"
  c.qbq.score_max_tokens = 56
  c.rl.steps = 16  # rounds x steps_per_round
  c.rl.loop.prompts_per_step = 4
  c.rl.loop.group_size = 8
  c.rl.loop.dynamic_sampling = False
  c.rl.learner.ppo_mini_batch_size = 0
  c.rl.loop.max_prompt_len = 40  # O2 variants double the expression
  c.rl.learner.eps_high = 0.2
  c.rl.learner.dual_clip = placeholder(float)  # None: no dual clip (TRL's GRPO)
  c.rl.learner.aggregation = "seq-mean-token-mean"
  c.rl.learner.mask_truncated = True
  c.rl.learner.normalize_all = True
  c.shaping.format_bonus = 0.1
  c.eval.every = 8  # after every round
  c.checkpoint.every = 8
  return c
