"""Hugging Face interop: `speedgpt export --format hf` and speedgpt reading such a folder back (folder.py)."""
