"""epic-slime: asynchronous off-policy RL with EPIC on slime, plus an embedded CPU runtime."""

__version__ = "0.1.0"
