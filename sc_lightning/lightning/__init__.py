"""The Lightning adapter: the strategy, the GRPO and PPO modules and the CLI's trainer parser (train pump: trainer/)."""
