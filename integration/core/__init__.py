"""Across sinks: stopping, speculation, the file-system sink, batch jobs, upgrades."""
