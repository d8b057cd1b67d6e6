"""The rollout side: prompt datasets and streams, and the environments that score completions."""
