"""The training loop every task shares (loop.py), what a task is (task_base.py), the tasks, and
what they use: the jitted step (train_step.py), the workdir around a start (workdir_setup.py),
the restore of a trained model (restore.py), optimizer, checkpoints, metrics, the data-parallel
mesh, joining jax.distributed (distributed.py), and the launcher of train.py and eval.py with
the task of a config (tasks.py). (Preemption, SIGTERM and Ctrl-C: relpos.signals; the command
line: relpos.cli and relpos.config.command_line.)"""
