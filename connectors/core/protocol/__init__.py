"""The protocol, sans I/O: the commands, the guard every command passes, one sink's
coordinator and a fan-out's program, recovery, the replay rule, crash points, transactions.
"""
