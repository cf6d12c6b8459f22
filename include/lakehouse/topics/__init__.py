"""Topics, the raw ``<bytes, bytes>`` logs, and bronze, their Delta copy: landing files in Kafka
Connect's layout (:mod:`~lakehouse.topics.landing`, :mod:`~lakehouse.topics.segments`), a topic
on a Kafka broker (:mod:`~lakehouse.topics.kafka`), and the exactly-once ingest of either into
bronze (:mod:`~lakehouse.topics.bronze`).
"""
