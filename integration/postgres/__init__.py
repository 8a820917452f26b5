"""PostgresSink against a real PostgreSQL server."""
