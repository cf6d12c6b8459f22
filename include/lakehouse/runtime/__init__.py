"""Where and how the platform runs: its settings (:mod:`~lakehouse.runtime.config`), where data
lives (:mod:`~lakehouse.runtime.objectstore`: a local folder or a bucket), Java and the processes
of its local servers (:mod:`~lakehouse.runtime.process`), the JVM's jars, the one Spark session
factory, and the local servers themselves: the Spark server, the Kafka broker, an S3 API and
PostgreSQL.
"""
