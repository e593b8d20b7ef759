"""The round: votes -> reward model -> PPO -> new policy -> next pairs, one at a time, resumable after a crash."""
