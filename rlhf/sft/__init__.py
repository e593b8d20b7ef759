"""Supervised fine-tuning on demonstrations: the first stage, which gives the reference and the first actor."""
