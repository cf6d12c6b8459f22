"""Streams, silver: a topic decoded by its contract into typed rows, bad records to quarantine.

:mod:`~lakehouse.streams.schema` is a stream's shape (what gold reads),
:mod:`~lakehouse.streams.decode` turns bronze records into typed rows,
:mod:`~lakehouse.streams.silver` is the job that appends them to the stream (and reprocesses), and
:mod:`~lakehouse.streams.registry` the schema registry of every version a topic's values and keys
were written with.
"""
