"""The environment layer: sandboxes, the agent's actions and tools, episodes, grading, task images
and curation. It imports only `swerl/` and itself; training/ and above build on it."""
