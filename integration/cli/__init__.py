"""The command line (``connectors status/recover/doctor/demo``) against real targets."""
