"""The training loop every task shares (loop.py), what a task is (task_base.py), the tasks, and
what they use: the jitted step (train_step.py), the workdir around a start (workdir_setup.py),
the restore of a trained model (restore.py), optimizer, checkpoints, metrics, the data-parallel
mesh. (Preemption, SIGTERM and Ctrl-C: relpos.signals.)"""
