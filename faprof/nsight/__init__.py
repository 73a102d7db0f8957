"""Nsight Compute and Nsight Systems integration: run the tools, parse their reports into tables."""
