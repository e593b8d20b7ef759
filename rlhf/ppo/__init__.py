"""PPO: the settings, the experience of a batch, the trainer of actor and critic, and a whole run from folders."""
