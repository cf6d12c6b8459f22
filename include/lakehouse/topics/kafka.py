"""Topics on a Kafka broker: a contract's ``kafka`` origin as client settings, the topic's
partitions and offsets (admin client), producing, and the consumer group bronze reports to.

Bronze reads the records with Spark's Kafka source (:mod:`lakehouse.topics.bronze`); everything here
runs in the driver or the command line with confluent-kafka (librdkafka). Bronze's position is
the one its Delta commits record; the consumer group ``lakehouse-bronze.<topic>`` only mirrors it,
so that Kafka's own tools show the lag.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Contract
from lakehouse.errors import BadRecordError, BrokerUnavailableError, ConfigError
from lakehouse.runtime.config import Settings
from lakehouse.topics.landing import Record, RecordMetadata

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

BOOTSTRAP_ENV = "LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS"
TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Client:
    """Where a topic lives on a broker and how to reach it. ``config`` holds resolved secrets:
    it is never printed (``repr`` leaves it out)."""

    contract_topic: str
    topic: str
    bootstrap_servers: str
    config: dict[str, str] = field(repr=False)

    @property
    def group(self) -> str:
        """The consumer group that mirrors bronze's position."""
        return f"lakehouse-bronze.{self.contract_topic}"

    @property
    def isolation(self) -> str:
        """What bronze reads of transactional producers' records: only committed ones (Kafka's
        ``read_committed``), unless the contract's client settings say otherwise."""
        return self.config.get("isolation.level", "read_committed")

    def spark_options(self) -> dict[str, str]:
        """The options of Spark's Kafka source: the client settings under ``kafka.``."""
        return {f"kafka.{k}": v for k, v in self.config.items()}

    def unavailable(
        self, what: str, exc: BaseException, outcome: str = "nothing was read or committed"
    ) -> BrokerUnavailableError:
        detail = str(exc) or f"no answer in {TIMEOUT_S:.0f} s"  # a future's timeout says nothing
        return BrokerUnavailableError(
            f"Kafka topic {self.topic}: {what} failed, the broker at {self.bootstrap_servers} did "
            f"not answer ({detail}); {outcome}. Check that it is running (the local one: "
            "lakehouse kafka status / lakehouse kafka start)"
        )


def bootstrap_servers(settings: Settings, contract: Contract) -> str:
    """The contract's servers, else ``$LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS``, else the broker of
    ``lakehouse kafka start``."""
    assert contract.kafka is not None
    if contract.kafka.bootstrap_servers:
        return contract.kafka.bootstrap_servers
    if os.environ.get(BOOTSTRAP_ENV):
        return os.environ[BOOTSTRAP_ENV]
    from lakehouse.runtime import broker

    return broker.bootstrap_servers(settings)


def client(settings: Settings, contract: Contract) -> Client:
    """The topic's client settings, secrets read from the environment variables the contract
    names. A missing variable fails here, before anything is read."""
    origin = contract.kafka
    if origin is None:
        raise ConfigError(
            f"topic {contract.topic!r} lands as files; its contract has no kafka section"
        )
    config = {"bootstrap.servers": bootstrap_servers(settings, contract), **dict(origin.properties)}
    missing = [var for _, var in origin.secrets if not os.environ.get(var)]
    if missing:
        raise ConfigError(
            f"{contract.file}: kafka.secrets names environment variable(s) {missing} for topic "
            f"{contract.topic!r}, and they are not set"
        )
    config.update({name: os.environ[var] for name, var in origin.secrets})
    return Client(contract.topic, origin.topic, config["bootstrap.servers"], config)


def _admin(c: Client) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    config: dict[str, str | int | float | bool] = dict(c.config)
    return AdminClient(config)


def partition_count(c: Client) -> int | None:
    """The topic's partition count on the broker, or None if it has no such topic."""
    from confluent_kafka import KafkaException

    try:
        meta = _admin(c).list_topics(topic=c.topic, timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise c.unavailable("reading the topic's metadata", exc) from exc
    found = meta.topics.get(c.topic)
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


def check_topic(c: Client, contract: Contract) -> None:
    """Refuse a topic the broker lacks or whose partition count disagrees with the contract."""
    n = partition_count(c)
    if n is None:
        raise ConfigError(
            f"Kafka topic {c.topic} does not exist at {c.bootstrap_servers}: create it with "
            f"its contract's {contract.partitions} partition(s): lakehouse create-topic "
            f"{contract.topic}"
        )
    if n != contract.partitions:
        raise ConfigError(
            f"{contract.file}: partitions is {contract.partitions}, but Kafka topic {c.topic} "
            f"at {c.bootstrap_servers} has {n}; records are keyed to partitions, so the two must "
            "agree: fix the contract (nothing was read)"
        )


def create_topic(c: Client, partitions: int, replication: int = 1) -> bool:
    """Create the topic with the contract's partition count; False if it already exists (its
    count is then checked by :func:`check_topic`)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = _admin(c)  # kept alive until the futures resolve: they fail if it is collected
    futures = admin.create_topics(
        [NewTopic(c.topic, num_partitions=partitions, replication_factor=replication)],
        request_timeout=TIMEOUT_S,
    )
    try:
        futures[c.topic].result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise c.unavailable("creating the topic", exc) from exc
    except TimeoutError as exc:  # no answer within TIMEOUT_S
        raise c.unavailable("creating the topic", exc) from exc
    # The controller has the topic; the brokers learn of it a moment later. Return once the
    # metadata a client gets lists it, so that what follows (a check, a produce) finds it.
    deadline = time.monotonic() + TIMEOUT_S
    while partition_count(c) != partitions:
        if time.monotonic() > deadline:
            raise c.unavailable("creating the topic", TimeoutError("not in the metadata yet"))
        time.sleep(0.05)
    return True


def offsets(c: Client, partitions: int) -> dict[int, tuple[int, int]]:
    """Per partition, the earliest offset the broker still has and the end offset, read now: a
    micro-batch reads up to these ends and no further. Reading committed records only, the end
    is the last stable offset (no open transaction's records are before it)."""
    from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(c)
    level = (
        IsolationLevel.READ_COMMITTED
        if c.isolation == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    result: dict[int, list[int]] = {p: [0, 0] for p in range(partitions)}
    for i, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        asked = {TopicPartition(c.topic, p): spec for p in range(partitions)}
        try:
            answers = admin.list_offsets(asked, isolation_level=level, request_timeout=TIMEOUT_S)
            for tp, future in answers.items():
                result[tp.partition][i] = future.result(timeout=TIMEOUT_S).offset
        except (KafkaException, TimeoutError) as exc:  # TimeoutError: no answer in TIMEOUT_S
            raise c.unavailable("reading the partitions' offsets", exc) from exc
    return {p: (lo, hi) for p, (lo, hi) in result.items()}


def _retrying(
    c: Client,
    what: str,
    request: Callable[[AdminClient], dict[Any, Any]],
    outcome: str = "nothing was read or committed",
) -> list[Any]:
    """Run an admin request until its results come, repeating it while the broker answers with
    a retriable error (a group coordinator still loading, a leader moving) for up to
    :data:`TIMEOUT_S`; any other error, or the time running out, raises."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + TIMEOUT_S
    while True:
        admin = _admin(c)  # kept alive until the futures resolve: they fail if it is collected
        try:
            results = [f.result(timeout=TIMEOUT_S) for f in request(admin).values()]
            # A group request answers per partition: an error there does not fail the future.
            for r in results:
                for tp in getattr(r, "topic_partitions", None) or ():
                    if tp.error is not None:
                        raise KafkaException(tp.error)
            return results
        except TimeoutError as exc:  # no answer within TIMEOUT_S: not worth repeating
            raise c.unavailable(what, exc, outcome) from exc
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not _retriable(error) or time.monotonic() > deadline:
                raise c.unavailable(what, exc, outcome) from exc
            time.sleep(0.2)


def _retriable(error: Any) -> bool:
    """Whether Kafka says to try again (a partition's error carries no retriable flag: its code
    is what tells)."""
    from confluent_kafka import KafkaError

    if error is None or not hasattr(error, "code"):
        return False
    return bool(error.retriable()) or error.code() in {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
    }


def commit_group(c: Client, next_offsets: dict[int, int]) -> None:
    """Mirror bronze's position in the topic's consumer group (Kafka's own tools then show the
    lag). Informational: a failure here leaves bronze's commit as it is and is raised."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    if not next_offsets:
        return
    parts = [TopicPartition(c.topic, p, n) for p, n in sorted(next_offsets.items())]
    _retrying(
        c,
        f"committing consumer group {c.group}",
        lambda admin: admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(c.group, parts)], request_timeout=TIMEOUT_S
        ),
        "bronze's commit stands, and the next batch updates the group",
    )


def group_offsets(c: Client) -> dict[int, int]:
    """The offsets committed to the topic's consumer group (what Kafka's tools see)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    (got,) = _retrying(
        c,
        f"reading consumer group {c.group}",
        lambda admin: admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(c.group)], request_timeout=TIMEOUT_S
        ),
    )
    return {
        tp.partition: tp.offset
        for tp in got.topic_partitions
        if tp.topic == c.topic and tp.offset >= 0
    }


_UNSURE = "records not acknowledged may or may not be on the broker"


class Producer:
    """Produces records to the broker as a Java producer would place them: keys hashed with
    murmur2 (librdkafka's ``murmur2_random``: the Java client's default for keyed records),
    an explicit partition kept; idempotent, so a retried send is not written twice."""

    def __init__(self, c: Client, partitions: int) -> None:
        from confluent_kafka import Producer as _Producer

        self.client, self.partitions = c, partitions
        self._producer = _Producer(
            {
                **c.config,
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )

    def send_batch(self, records: Iterable[Record]) -> list[RecordMetadata]:
        """Send the records and wait for the broker's acknowledgements; each record's partition
        and offset, in input order. A record the broker refused raises, naming it."""
        from confluent_kafka import KafkaException

        results: dict[int, RecordMetadata] = {}
        errors: list[str] = []

        def delivered(i: int) -> Any:
            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(f"record {i}: {err}")
                    return
                _, ts = msg.timestamp()
                results[i] = RecordMetadata(msg.topic(), msg.partition(), msg.offset(), ts)

            return report

        n = 0
        for i, rec in enumerate(records):
            n += 1
            if rec.partition is not None and not 0 <= rec.partition < self.partitions:
                raise BadRecordError(
                    f"topic {self.client.topic}",
                    f"partition {rec.partition} out of range: the topic has {self.partitions}",
                )
            kwargs: dict[str, Any] = {"on_delivery": delivered(i)}
            if rec.partition is not None:
                kwargs["partition"] = rec.partition
            if rec.timestamp_ms is not None:
                kwargs["timestamp"] = rec.timestamp_ms
            if rec.headers:
                kwargs["headers"] = list(rec.headers)
            while True:
                try:
                    self._producer.produce(self.client.topic, rec.value, rec.key, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self._producer.poll(0.1)
            self._producer.poll(0)
        try:
            left = self._producer.flush(TIMEOUT_S)
        except KafkaException as exc:
            raise self.client.unavailable("producing", exc, _UNSURE) from exc
        if errors:
            raise BadRecordError(f"topic {self.client.topic}", "; ".join(errors[:5]))
        if left or len(results) < n:
            raise self.client.unavailable(
                "producing",
                TimeoutError(f"{n - len(results)} record(s) not acknowledged"),
                _UNSURE,
            )
        return [results[i] for i in range(n)]
