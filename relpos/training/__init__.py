"""The training loop every task shares (loop.py), the tasks, and what they use: optimizer,
checkpoints, metrics, the data-parallel mesh, preemption."""
