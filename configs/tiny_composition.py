"""Composition-RL at embedded scale: the depth curriculum on composed arithmetic.

The arithmetic task of configs/tiny_rlvr.py composed by construction
(`rlvr.data.tasks.composed`: "X=3*5-2. Y=X-11. Compute 9*Y+2." -> 20), depths 1, 2, 3,
with exact answers, so the whole method runs on 2 CPU cores without an assistant
model. SFT sees worked solutions at every depth; GRPO then follows the paper's
curriculum: depth 1, then 2, then 3, moving on after `max_steps` steps or once
solve_all averages 0.6 over 5 steps. Held-out pass@k per depth (heldout_d1..d3).

  python -m launch.train --config=configs/tiny_composition.py
"""

from configs import tiny_rlvr


def get_config():
  c = tiny_rlvr.get_config()
  c.workdir = "workdir/tiny_composition"
  c.method = "composition"
  c.data.arithmetic.depths = (1, 2, 3)
  c.data.arithmetic.n_sft = 300  # per depth
  c.data.arithmetic.n_train = 2000  # per depth
  c.data.arithmetic.n_heldout = 128  # per depth
  c.sft.steps = 800
  c.composition.depths = (1, 2, 3)
  c.composition.max_steps = 30
  c.composition.solve_all_threshold = 0.6
  c.composition.window = 5
  c.rl.steps = 90
  c.rl.loop.max_prompt_len = 64  # depth 3: 43 tokens of problem + the chat template
  c.rl.loop.max_response_len = 96  # depth 3 worked solutions: up to 85 tokens
  c.eval.sampling.max_tokens = 96
  return c
