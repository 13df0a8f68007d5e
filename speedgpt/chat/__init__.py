"""From base model to assistant: the chat template (template.py), conversations from files and the
built-in tasks (data.py, tasks.py), packing them into rows (pack.py), fine-tuning (sft.py), chat
evaluation (evaluate.py) and the terminal and web chat (session.py, serve.py)."""
