"""Ledgers: the contract every sink's durable decisions keep, the file and object-store
ledgers, and the object store's lease.
"""
