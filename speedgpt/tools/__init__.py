"""Tools that check speedgpt from the outside, running its commands as a user would: the fault
suite (kills and restarts runs, fault_suite.py) and the DCP reshard check (reshard_check.py).
scripts/ holds their thin entry points; none of this is imported by training."""
