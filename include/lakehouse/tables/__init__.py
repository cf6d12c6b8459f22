"""Gold: a table is an aggregated stream (Kafka Streams' KTable), and its Delta change data feed
is its changelog.

Semantics follow Kafka Streams:

* ``latest`` (a KTable read from a stream): the latest value per key, in offset order within a
  partition; a tombstone (null value) deletes the key; a record with a null key is ignored.
* ``aggregate`` (a grouped aggregation): count/sum/min/max/avg per key, or per value of a
  ``group_by`` field (re-keying); records whose key, value or group is null are ignored. Over
  the ``stream`` every event counts (KGroupedStream); over the stream read as a ``table`` only
  each key's latest value counts, and an update takes the old value back before adding the new
  one (KGroupedTable): key k1 with values 2 then 5 sums to 7 as a stream and to 5 as a table.
  An input read as a table keeps each key's latest value in a state table beside the gold table.

Each kind of table is one module behind one protocol (:mod:`~lakehouse.tables.kind`):
:mod:`~lakehouse.tables.latest`, :mod:`~lakehouse.tables.aggregate`,
:mod:`~lakehouse.tables.windowed`, :mod:`~lakehouse.tables.stream_table`,
:mod:`~lakehouse.tables.table_table`, :mod:`~lakehouse.tables.stream_stream` and
:mod:`~lakehouse.tables.history`. A micro-batch reads the input's change feed from the last version
consumed, transforms it with the table's state into its changes (pure), and commits them with the
consumed versions. What they share: :mod:`~lakehouse.tables.common` (inputs, outputs, stream
time), :mod:`~lakehouse.tables.keyed` (each key's latest value), :mod:`~lakehouse.tables.aggregations`
and :mod:`~lakehouse.tables.joined`. :mod:`~lakehouse.tables.gold` builds a topic's tables side
by side, and :mod:`~lakehouse.tables.rebuild` rebuilds a table from its input.
"""
