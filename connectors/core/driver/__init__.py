"""The driver side: ``SinkDriver`` (the only builder of programs and executors), the executor
and its performers (the only places with a protocol step's I/O), a run's state, the
DataSource form's split batch.
"""
