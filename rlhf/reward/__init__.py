"""The reward model: the model and its data, full training, the few-vote strategies (heads on frozen features) and
the choice of the next pairs by their disagreement."""
