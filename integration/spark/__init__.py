"""The Spark side: sessions, plans, fingerprints."""
