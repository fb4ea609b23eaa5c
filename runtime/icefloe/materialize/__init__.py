"""One batch of one table: choose the read path, decode (on the JVM or in Python tasks), apply the error mode, write.

`batch` drives one batch end to end; `read_paths` picks JVM or Python; `python_tasks` runs on executors;
`conversion` shapes values; `upsert` merges keyed changes; `dead_letters` keeps failed records; `budget` sizes a
batch to the time it has. Imports `source`, `formats`, `table`, `commit` and the contracts; never `operate`.
"""
