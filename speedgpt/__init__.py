"""speedgpt: fast GPT pretraining, from one CPU to many GPUs."""

__version__ = "0.1.0"
