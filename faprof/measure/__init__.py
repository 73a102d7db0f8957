"""The measure stage: correctness first, then timing (CUPTI, clocks, statistics), and the machine's ceilings."""
