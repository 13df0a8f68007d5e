"""Optimizers and schedules."""
