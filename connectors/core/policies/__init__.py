"""Policies: retrying a step, restarting a batch through an outage, stopping a query
gracefully.
"""
