"""The sinks under Spark Connect (a Connect server of its own)."""
