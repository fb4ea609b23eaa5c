"""Running the tables and watching them: the runner (one-shot and continuous), maintenance, status, lag, heartbeat,
metrics and progress. The top layer under `cli`: may import every other subpackage.
"""
