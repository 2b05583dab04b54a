"""The embedded CPU runtime: the whole asynchronous EPIC loop on Ray, with a tiny Qwen3-MoE on a
synthetic, verifiable arithmetic task. Entry points: `epic-slime train`, `epic-slime sweep`
(`epic_slime.runtime.cli`). Nothing here imports slime."""
