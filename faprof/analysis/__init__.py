"""The analysis stage: every DataFrame-returning analysis of run bundles, shared by the CLI, reports and app."""
