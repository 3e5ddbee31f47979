"""Experiments: the method registry, run configurations and profiles, the run groups, the
results cache, sweeps, tuning, the prerequisites check and the command line. Imports the
simulator and the method, never the book's helpers."""
