"""What connector authors subclass and call: ``TwoPhaseCommitSink``, the three protocol
families and their hooks, the task functions, options, and ``FanOut``.
"""
