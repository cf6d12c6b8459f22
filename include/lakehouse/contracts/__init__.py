"""Data contracts: one YAML file per topic declares its formats, schemas, tables and
expectations (:mod:`~lakehouse.contracts.model`, read through the document's models in
:mod:`~lakehouse.contracts.document`), and the wire formats it names: Avro in the Confluent
framing (:mod:`~lakehouse.contracts.avro`) and the producer's serializers
(:mod:`~lakehouse.contracts.serde`).
"""
