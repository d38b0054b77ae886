"""Plumbing shared by every trainer: configs, seeding, devices, run folders."""
