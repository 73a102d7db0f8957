"""The model stage: attention problems, scenarios, the run plan, the variant registry, the row schema, GPUs."""
