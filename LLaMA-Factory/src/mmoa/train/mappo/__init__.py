"""MAPPO: arguments, rollout, rewards, PPO math, Trainer subclass and workflow."""
