"""configs/tiny_rlvr.py with LoRA in RL: after the same full SFT, GRPO trains rank-16
adapters on the attention and MLP projections of the frozen SFT model (122,880 weights,
16% of its 747,520) at 10x full fine-tuning's learning rate (the LoRA RL recipes of TRL,
verl and others: alpha 2 x rank, no dropout); the KL reference, when on, is the base with
the adapters off.

  python -m launch.train --config=configs/tiny_rlvr_lora.py

With the vLLM sampler, start the server with LoRA on and push adapters only:
`--config.sampler.lora_adapters=True` (docs/lora.md).
"""

from configs import tiny_rlvr


def get_config():
  c = tiny_rlvr.get_config()
  c.workdir = "workdir/tiny_rlvr_lora"
  c.rl.learner.lora.rank = 16
  c.rl.learner.lora.alpha = 32.0
  c.rl.learner.lora.dropout = 0.0
  c.rl.learner.learning_rate = 2e-3
  return c
