"""Process groups and parallelism: one device, data-parallel, FSDP2."""
