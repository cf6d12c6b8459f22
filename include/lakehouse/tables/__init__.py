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

Each micro-batch of a ``latest`` or ``aggregate`` table (:mod:`~lakehouse.tables.aggregates`) reads the stream's change feed from the last version consumed, reduces it to one
row per key (pure transforms below), and merges that into the table in one commit that also
records the consumed stream version.


Windows (:mod:`~lakehouse.tables.windows`) and joins (:mod:`~lakehouse.tables.joins`) build on the
same helpers (:mod:`~lakehouse.tables.common`); :mod:`~lakehouse.tables.gold` hands each table to the
module of its kind, and :mod:`~lakehouse.tables.rebuild` rebuilds a table from its input.
"""
