"""Topics, the raw ``<bytes, bytes>`` logs, and bronze, their Delta copy: landing files in Kafka
Connect's layout (:mod:`~lakehouse.topics.landing`, :mod:`~lakehouse.topics.segments`), a topic
on a Kafka broker (:mod:`~lakehouse.topics.kafka`), and the exactly-once ingest of either into
bronze (:mod:`~lakehouse.topics.bronze`, the job; :mod:`~lakehouse.topics.from_landing` and
:mod:`~lakehouse.topics.from_kafka`, one per origin; :mod:`~lakehouse.topics.bronze_table`, the
table both append to).
"""
