"""The GPT model: speedrun-recipe transformer with pluggable attention backends."""
