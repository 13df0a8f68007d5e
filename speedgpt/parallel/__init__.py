"""Process groups (dist.py) and data parallelism with gradient reduce-scatter from backward hooks (ddp.py)."""
