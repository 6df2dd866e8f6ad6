"""Post-training: log-probs, KL estimators, SFT, DPO, PPO and the GRPO family, rewards and rollouts."""
