"""The parts behind loss.py's policy_loss (none imports slime): the adapter (slime's batch -> the
project's [B, T] loss inputs), the context-parallel gathers, TIS and the Top-K inputs."""
