"""The commands `rlhfkit COMMAND` runs, one module each (trainers are commands too: trainers/)."""
