"""Low-level utilities every layer may use: imports, seeding, precision, the allocator, devices,
config parsing, disk writes, checkpoint-folder reading. Nothing here imports another rlhfkit package."""
