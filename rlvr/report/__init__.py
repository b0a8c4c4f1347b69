"""What a run reports, apart from running it: the metrics writer and its trackers
(`metrics`: metrics.jsonl, TensorBoard, wandb), sampled responses on disk (`samples_log`),
the plots of a run (`plots`) and several runs side by side (`compare`, `launch.compare`).
The run layer (`rlvr.run`) calls them; nothing here trains, samples or scores."""
