"""Helpers shared by the integration tests of every folder: drivers, targets, fixtures."""
