"""Data contracts: one YAML file per topic declares its formats, schemas, tables and
expectations (:mod:`~lakehouse.contracts.model`, the platform's types), read through the
document's models in :mod:`~lakehouse.contracts.document` by :mod:`~lakehouse.contracts.catalog`
and checked across the document by :mod:`~lakehouse.contracts.checks`; and the wire formats it
names: Avro in the Confluent framing (:mod:`~lakehouse.contracts.avro`) and the producer's
serializers (:mod:`~lakehouse.contracts.serde`).
"""
