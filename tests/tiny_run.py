"""Flags of the smallest launch.train run of configs/tiny_rlvr.py that still trains and
evaluates: no SFT, 8 problems, one group of 2 x 4 responses of 8 tokens, raw prompts.
Tests that run it share its compiled programs (the session's XLA cache)."""

RAW_PROMPTS_RUN = [
  "--config.sft.steps=0",
  "--config.data.arithmetic.n_sft=0",
  "--config.data.arithmetic.n_train=8",
  "--config.data.arithmetic.n_heldout=2",
  "--config.rl.loop.prompts_per_step=2",
  "--config.rl.loop.group_size=4",
  "--config.rl.loop.max_prompt_len=8",
  "--config.rl.loop.max_response_len=8",
  "--config.rl.loop.dynamic_sampling=False",
  "--config.eval.sampling.n=2",
  "--config.eval.sampling.max_tokens=8",
  "--config.data.chat_template=none",
]
