"""Streams, silver: a topic decoded by its contract into typed rows, bad records to quarantine
(:mod:`~lakehouse.streams.silver`), and the schema registry of every version a topic's values
and keys were written with (:mod:`~lakehouse.streams.registry`).
"""
