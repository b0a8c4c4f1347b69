"""verl's and TRL's names for rlvr's settings, and the one line a config that uses one gets.

`VERL` (Hydra config paths) and `TRL` (`GRPOConfig` and `TrainingArguments` fields) map
their name to the rlvr config path that does the same, or to None where rlvr has no such
setting. docs/coming-from-verl-trl.md shows the same pairs with how each one differs
(tests/repo/test_vocabulary.py holds the doc's tables equal to these).

`unknown_field(section, field)` is the line for a field unknown in a config section when it
is one of their names (`--config.rl.loop.num_generations=8`):

  unknown config field rl.loop.num_generations (TRL's name); rlvr's is rl.loop.group_size

A name is matched by its last two or more parts (`actor_rollout_ref.rollout.n`,
`rollout.n`, `optim.lr`), or by its last part alone (`n`, `num_generations`) where that
part points at one rlvr setting, or at one inside the section the field was set in, and is
not rlvr's own word there: TRL's `temperature` is rlvr's `rl.loop.temperature` too, and
`eval.n` means rlvr's `eval.sampling.n`, so a config that sets one of those in the wrong
section is left to the caller's own hint (the fields of that name); `rl.loop.n` is verl's
rollout n.
"""

from __future__ import annotations

import dataclasses

DOC = "docs/coming-from-verl-trl.md"

VERL: dict[str, str | None] = {
  # batch, groups, lengths, sampling
  "data.train_batch_size": "rl.loop.prompts_per_step",
  "actor_rollout_ref.rollout.n": "rl.loop.group_size",
  "data.max_prompt_length": "rl.loop.max_prompt_len",
  "data.max_response_length": "rl.loop.max_response_len",
  "data.filter_overlong_prompts": None,
  "data.truncation": None,
  "actor_rollout_ref.rollout.temperature": "rl.loop.temperature",
  "actor_rollout_ref.rollout.top_p": "rl.loop.top_p",
  "actor_rollout_ref.rollout.top_k": "rl.loop.top_k",
  "actor_rollout_ref.rollout.name": "sampler.kind",
  "actor_rollout_ref.rollout.val_kwargs.n": "eval.sampling.n",
  "actor_rollout_ref.rollout.val_kwargs.temperature": "eval.sampling.temperature",
  # dynamic sampling (DAPO)
  "algorithm.filter_groups.enable": "rl.loop.dynamic_sampling",
  "algorithm.filter_groups.metric": None,
  "algorithm.filter_groups.max_num_gen_batches": "rl.loop.max_extra_rounds",
  "data.gen_batch_size": "rl.loop.oversample",
  # advantages and the policy loss
  "algorithm.adv_estimator": "rl.learner.advantage",
  "algorithm.norm_adv_by_std_in_grpo": "rl.learner.normalize_std",
  "actor_rollout_ref.actor.policy_loss.loss_mode": "rl.learner.policy_loss",
  "actor_rollout_ref.actor.clip_ratio": "rl.learner.eps_low",
  "actor_rollout_ref.actor.clip_ratio_low": "rl.learner.eps_low",
  "actor_rollout_ref.actor.clip_ratio_high": "rl.learner.eps_high",
  "actor_rollout_ref.actor.clip_ratio_c": "rl.learner.dual_clip",
  "actor_rollout_ref.actor.loss_agg_mode": "rl.learner.aggregation",
  "actor_rollout_ref.actor.use_kl_loss": "rl.learner.kl_beta",
  "actor_rollout_ref.actor.kl_loss_coef": "rl.learner.kl_beta",
  "actor_rollout_ref.actor.kl_loss_type": "rl.learner.kl_estimator",
  "algorithm.use_kl_in_reward": None,
  "actor_rollout_ref.actor.entropy_coeff": None,
  "algorithm.rollout_correction.rollout_is": "rl.learner.tis_level",
  "algorithm.rollout_correction.rollout_is_threshold": "rl.learner.tis_cap",
  "algorithm.rollout_correction.rollout_rs": "rl.learner.seq_mask_cap",
  "actor_rollout_ref.actor.router_replay.mode": "rl.learner.routing_replay",
  # mini-batches, micro-batches, memory
  "actor_rollout_ref.actor.ppo_mini_batch_size": "rl.learner.ppo_mini_batch_size",
  "actor_rollout_ref.actor.ppo_epochs": "rl.learner.ppo_epochs",
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "rl.learner.micro_batch_rows",
  "actor_rollout_ref.model.use_remove_padding": "rl.learner.pack",
  "actor_rollout_ref.actor.use_dynamic_bsz": "rl.learner.pack",
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "rl.learner.pack_len",
  "actor_rollout_ref.model.enable_gradient_checkpointing": "rl.learner.remat",
  # optimizer
  "actor_rollout_ref.actor.optim.lr": "rl.learner.learning_rate",
  "actor_rollout_ref.actor.optim.weight_decay": "rl.learner.weight_decay",
  "actor_rollout_ref.actor.optim.betas": "rl.learner.b1",
  "actor_rollout_ref.actor.optim.lr_warmup_steps": "rl.learner.warmup_steps",
  "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "rl.learner.warmup_steps",
  "actor_rollout_ref.actor.optim.lr_scheduler_type": "rl.learner.lr_schedule",
  "actor_rollout_ref.actor.optim.min_lr_ratio": "rl.learner.min_lr_ratio",
  "actor_rollout_ref.actor.grad_clip": "rl.learner.grad_clip",
  # model
  "actor_rollout_ref.model.path": "model.path",
  "actor_rollout_ref.model.lora_rank": "rl.learner.lora.rank",
  "actor_rollout_ref.model.lora_alpha": "rl.learner.lora.alpha",
  # data and rewards
  "data.train_files": "data.train_path",
  "data.val_files": "data.eval_paths",
  "data.prompt_key": "data.problem_field",
  "data.val_max_samples": "data.eval_limit",
  "custom_reward_function.path": "reward.domain",
  "custom_reward_function.name": "reward.domain",
  "reward_model.reward_manager": None,
  "reward_model.overlong_buffer.enable": "shaping.overlong_cache",
  "reward_model.overlong_buffer.len": "shaping.overlong_cache",
  "reward_model.overlong_buffer.penalty_factor": None,
  "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "env.max_turns",
  # the run
  "trainer.total_training_steps": "rl.steps",
  "trainer.total_epochs": None,
  "trainer.save_freq": "checkpoint.every",
  "trainer.max_actor_ckpt_to_keep": "checkpoint.keep",
  "trainer.test_freq": "eval.every",
  "trainer.val_before_train": None,
  "trainer.log_val_generations": "eval.samples",
  "trainer.rollout_data_dir": "rl.log_samples_every",
  "trainer.default_local_dir": "workdir",
  "trainer.resume_mode": None,
  "trainer.logger": "logging.wandb",
  "trainer.project_name": "logging.wandb_project",
  "trainer.experiment_name": "logging.wandb_name",
  "trainer.n_gpus_per_node": "mesh",
  "trainer.nnodes": "coordinator",
}

TRL: dict[str, str | None] = {
  # batch, groups, lengths, sampling
  "num_generations": "rl.loop.group_size",
  "generation_batch_size": "rl.loop.prompts_per_step",
  "per_device_train_batch_size": "rl.learner.micro_batch_rows",
  "gradient_accumulation_steps": "rl.learner.micro_batches",
  "steps_per_generation": "rl.learner.ppo_mini_batch_size",
  "num_iterations": "rl.learner.ppo_epochs",
  "max_prompt_length": "rl.loop.max_prompt_len",
  "max_completion_length": "rl.loop.max_response_len",
  "temperature": "rl.loop.temperature",
  "top_p": "rl.loop.top_p",
  "top_k": "rl.loop.top_k",
  "min_p": None,
  "repetition_penalty": "rl.loop.repetition_penalty",
  "num_generations_eval": "eval.sampling.n",
  "use_vllm": "sampler.kind",
  "vllm_server_base_url": "sampler.urls",
  "shuffle_dataset": None,
  # the loss
  "loss_type": "rl.learner.aggregation",
  "importance_sampling_level": "rl.learner.policy_loss",
  "epsilon": "rl.learner.eps_low",
  "epsilon_high": "rl.learner.eps_high",
  "delta": "rl.learner.dual_clip",
  "beta": "rl.learner.kl_beta",
  "scale_rewards": "rl.learner.normalize_std",
  "mask_truncated_completions": "rl.learner.mask_truncated",
  "top_entropy_quantile": None,
  "entropy_coef": None,
  "multi_objective_aggregation": None,
  "off_policy_mask_threshold": None,
  "sync_ref_model": None,
  "vllm_importance_sampling_correction": "rl.learner.tis_cap",
  "vllm_importance_sampling_mode": "rl.learner.tis_level",
  "vllm_importance_sampling_clip_max": "rl.learner.tis_cap",
  "router_aux_loss_coef": "rl.learner.moe_aux_loss_coef",
  # rewards
  "reward_weights": "reward.weights",
  "max_tool_calling_iterations": "env.max_tool_calls",
  # optimizer (TrainingArguments)
  "learning_rate": "rl.learner.learning_rate",
  "lr_scheduler_type": "rl.learner.lr_schedule",
  "warmup_steps": "rl.learner.warmup_steps",
  "warmup_ratio": "rl.learner.warmup_steps",
  "weight_decay": "rl.learner.weight_decay",
  "adam_beta1": "rl.learner.b1",
  "adam_beta2": "rl.learner.b2",
  "adam_epsilon": "rl.learner.adam_eps",
  "max_grad_norm": "rl.learner.grad_clip",
  "gradient_checkpointing": "rl.learner.remat",
  "bf16": "rl.learner.compute_dtype",
  # the run (TrainingArguments)
  "max_steps": "rl.steps",
  "num_train_epochs": None,
  "output_dir": "workdir",
  "save_steps": "checkpoint.every",
  "save_total_limit": "checkpoint.keep",
  "eval_steps": "eval.every",
  "seed": "seed",
  "log_completions": "rl.log_samples_every",
  "report_to": "logging.wandb",
  "run_name": "logging.wandb_name",
}

TABLES = {"verl": VERL, "TRL": TRL}


@dataclasses.dataclass(frozen=True)
class Match:
  whose: str  # "verl" | "TRL"
  name: str  # their name
  rlvr: str | None  # rlvr's config path; None: no such setting
  tail: int  # how many of the name's last parts the field's path ends with
  whole: bool  # the path ends with the whole name


def _tail(parts: list[str], name: list[str]) -> int:
  n = 0
  while n < min(len(parts), len(name)) and parts[-1 - n] == name[-1 - n]:
    n += 1
  return n


def _own_word(name: str, rlvr: str | None) -> bool:
  """Their name's last part is also the last part of rlvr's path: the same word."""
  return rlvr is not None and name.rsplit(".", 1)[-1] == rlvr.rsplit(".", 1)[-1]


def matches(section: str, field: str) -> list[Match]:
  """Their names that `field` (unknown in the config section at `section`, "" for the top
  level) is, by the rules of this module's docstring; [] for none."""
  parts = [p for p in f"{section}.{field}".split(".") if p]
  found = []
  for whose, table in TABLES.items():
    for name, rlvr in table.items():
      words = name.split(".")
      tail = _tail(parts, words)
      if tail:
        found.append(Match(whose, name, rlvr, tail, tail == len(words)))
  if not found:
    return []
  best = max(m.tail for m in found)
  found = [m for m in found if m.tail == best]
  if best >= 2:
    return found
  inside = [m for m in found if section and (m.rlvr or "").startswith(section + ".")]
  if any(_own_word(m.name, m.rlvr) for m in inside):
    return []  # rlvr's own word in this section (`eval.n`: eval.sampling.n)
  found = inside or [m for m in found if not _own_word(m.name, m.rlvr)]
  return found if len({m.rlvr for m in found}) == 1 else []


def unknown_field(section: str, field: str, shown: str | None = None) -> str | None:
  """The one line for `field`, unknown in the config section at `section` ("rl.loop"; ""
  for the top level or where the place is not known), when it is verl's or TRL's name for a
  setting; None otherwise. `shown`: the field as the line names it (default its path)."""
  found = matches(section, field)
  if not found:
    return None
  path = shown or (f"{section}.{field}" if section else field)
  by_target: dict[str | None, list[str]] = {}
  for m in found:
    by_target.setdefault(m.rlvr, []).append(
      f"{m.whose}'s name" if m.whole else f"{m.whose}'s {m.name}"
    )
  if len(by_target) == 1:
    [(rlvr, labels)] = by_target.items()
    said = f"rlvr's is {rlvr}" if rlvr else f"rlvr has no such setting ({DOC})"
    return f"unknown config field {path} ({' and '.join(labels)}); {said}"
  said = " or ".join(
    f"{rlvr or 'none'} ({' and '.join(labels)})" for rlvr, labels in by_target.items()
  )
  return f"unknown config field {path}; rlvr's is {said}"
