/*
 * The tests' Kafka Streams oracle: real Kafka Streams (4.4.0, the broker's version) run in a
 * TopologyTestDriver, against which the property tests compare the platform's tables.
 *
 * One file, run with Java's single-file source launcher, so that nothing is built at install:
 *
 *     java -cp '.venv/oracle-jars/*' tests/oracle/StreamsOracle.java
 *
 * It reads one JSON request per line on stdin and writes one JSON response per line on stdout
 * until stdin ends (tests/oracle.py is its client, where the format is described). Each request
 * gets a topology of its own, built from its table, in a fresh TopologyTestDriver with a fresh
 * state folder and no record cache (every update is forwarded); its records are piped in the
 * order given, and after each one the output topic is read, so that every change is traced to
 * the input record that caused it. A request that fails is answered {"error": "..."} and the
 * next one is served. Kafka's log goes to stderr (WARN and up: e.g. "Skipping record for
 * expired window"); stdout carries the responses alone.
 *
 * What the aggregate functions do with one value is ours (Kafka Streams only calls them); which
 * records reach them, and which windows they update, is Kafka Streams' own: nothing here drops a
 * record. An aggregate's entries whose name starts with "__" are the oracle's bookkeeping (an
 * avg's sum and count, a count_distinct's values, the input positions of earliest, latest and
 * collect, a table aggregate's member count).
 */

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.DoubleNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.LongNode;
import com.fasterxml.jackson.databind.node.NullNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.function.Function;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Window;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.VersionedKeyValueStore;
import org.apache.kafka.streams.state.VersionedRecord;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.test.TestRecord;

public class StreamsOracle {
    static final ObjectMapper JSON = new ObjectMapper();
    static final JsonNodeFactory NODES = JsonNodeFactory.instance;
    static final Serde<String> KEYS = Serdes.String();
    static final Serde<JsonNode> VALUES = new JsonSerde();
    static final String LEFT = "left";
    static final String RIGHT = "right";
    static final String OUT = "out";
    /** The versioned table of a stream-table join keeps every version (100 years of history). */
    static final Duration VERSIONS_KEPT = Duration.ofDays(36500);
    /** The versioned store of a "history" request. */
    static final String HISTORY = "history";

    /**
     * The position in the request of the input record being piped. The driver processes a record
     * (and what it sends through repartition topics) within pipeInput, on this thread, so the
     * aggregator reads here which input record it is aggregating: earliest, latest and collect
     * follow input order, across session merges too.
     */
    static int current = -1;

    /** An error in the request itself: its message says what to fix. */
    static final class BadRequest extends RuntimeException {
        BadRequest(String message) {
            super(message);
        }
    }

    public static void main(String[] args) throws IOException {
        // SLF4J's simple binding reads these when Kafka's first logger is made (after this line);
        // -D on the command line wins.
        setDefault("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        setDefault("org.slf4j.simpleLogger.logFile", "System.err");
        // Two warnings that every request would repeat: that the topology's internal topics and
        // stores have generated names, and that its state folder is a temporary one (it is, by
        // design: one per request, deleted after it).
        setDefault("org.slf4j.simpleLogger.log.org.apache.kafka.streams.processor.internals.InternalTopologyBuilder",
                "error");
        setDefault("org.slf4j.simpleLogger.log.org.apache.kafka.streams.processor.internals.StateDirectory", "error");
        // Responses go to the real stdout; anything else that prints there goes to stderr.
        PrintStream responses =
                new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        System.setOut(System.err);
        BufferedReader requests =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = requests.readLine()) != null; ) {
            JsonNode response;
            try {
                response = serve(line);
            } catch (BadRequest e) {
                System.err.println("bad request: " + e.getMessage());
                response = NODES.objectNode().put("error", e.getMessage());
            } catch (Throwable e) { // one failed request must not end the others
                e.printStackTrace();
                response = NODES.objectNode().put("error", describe(e));
            }
            responses.println(JSON.writeValueAsString(response));
            responses.flush();
        }
    }

    static void setDefault(String property, String value) {
        if (System.getProperty(property) == null) {
            System.setProperty(property, value);
        }
    }

    /** An exception and its causes, one line each: Kafka wraps the aggregator's errors. */
    static String describe(Throwable e) {
        List<String> parts = new ArrayList<>();
        Set<Throwable> seen = new HashSet<>();
        for (Throwable t = e; t != null && seen.add(t); t = t.getCause()) {
            String message = t.getMessage() == null ? "" : t.getMessage().lines().findFirst().orElse("");
            parts.add(t instanceof BadRequest ? message : t.getClass().getSimpleName() + ": " + message);
        }
        return String.join("; caused by ", parts);
    }

    // -- One request -------------------------------------------------------------------------

    static JsonNode serve(String line) throws IOException {
        JsonNode request;
        try {
            request = JSON.readTree(line);
        } catch (JsonProcessingException e) {
            throw new BadRequest("the request is not JSON: " + e.getOriginalMessage());
        }
        if (request == null || !request.isObject()) {
            throw new BadRequest("the request must be a JSON object {\"table\": ..., \"records\": [...]}");
        }
        JsonNode table = object(request, "table", "the request");
        JsonNode records = request.get("records");
        if (records == null || !records.isArray()) {
            throw new BadRequest("the request's \"records\" must be a list");
        }
        StreamsBuilder builder = new StreamsBuilder();
        Plan plan = build(builder, table);
        Path state = Files.createTempDirectory("streams-oracle-");
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), config(state))) {
            ObjectNode response = (ObjectNode) pipe(driver, plan, records);
            if (HISTORY.equals(table.get("kind").textValue())) {
                response.set("probes", probe(driver.getVersionedKeyValueStore(HISTORY), request.get("probes")));
            }
            return response;
        } finally {
            current = -1;
            deleteTree(state);
        }
    }

    static Properties config(Path state) {
        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, "streams-oracle");
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "unused:9092");
        config.put(StreamsConfig.STATE_DIR_CONFIG, state.toString());
        // No record cache: every update of a table is forwarded, none folded into a later one.
        config.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        // The serdes the DSL falls back on where an operator is given none (a foreign-key join's
        // internal topics).
        config.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        config.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, JsonSerde.class);
        // There is no global table here; this only stops a warning (per request) that the default
        // will change in Kafka 5.0.
        config.put("processing.exception.handler.global.enabled", true);
        return config;
    }

    /**
     * A request's topology, as its records see it: the input topics it reads, and whether its
     * output topic holds a table's changelog or a stream's records (a join of a stream).
     */
    record Plan(Set<String> inputs, boolean stream) { }

    static JsonNode pipe(TopologyTestDriver driver, Plan plan, JsonNode records) {
        Map<String, TestInputTopic<String, JsonNode>> inputs = new LinkedHashMap<>();
        TestOutputTopic<String, JsonNode> out =
                driver.createOutputTopic(OUT, KEYS.deserializer(), VALUES.deserializer());
        ArrayNode changelog = NODES.arrayNode();
        ArrayNode caused = NODES.arrayNode();
        for (int i = 0; i < records.size(); i++) {
            JsonNode record = records.get(i);
            String where = "record " + i;
            if (!record.isObject()) {
                throw new BadRequest(where + " must be an object {\"input\", \"key\", \"value\", \"ts\"}");
            }
            String input = text(record, "input", where);
            if (!input.equals(LEFT) && !input.equals(RIGHT)) {
                throw new BadRequest(where + ": \"input\" must be \"left\" or \"right\", not " + record.get("input"));
            }
            if (!plan.inputs().contains(input)) {
                throw new BadRequest(where + ": this table has no \"" + input + "\" input");
            }
            JsonNode key = record.get("key");
            if (key != null && !key.isNull() && !key.isTextual()) {
                throw new BadRequest(where + ": \"key\" must be a string or null, not " + key);
            }
            JsonNode value = record.get("value");
            if (value != null && !value.isNull() && !value.isObject()) {
                throw new BadRequest(where + ": \"value\" must be an object or null, not " + value);
            }
            JsonNode ts = record.get("ts");
            if (ts == null || !ts.isIntegralNumber() || !ts.canConvertToLong()) {
                throw new BadRequest(where + ": \"ts\" must be epoch milliseconds (a whole number), not " + ts);
            }
            TestInputTopic<String, JsonNode> topic = inputs.computeIfAbsent(
                    input, name -> driver.createInputTopic(name, KEYS.serializer(), VALUES.serializer()));
            current = i;
            topic.pipeInput(
                    key == null || key.isNull() ? null : key.textValue(),
                    value == null || value.isNull() ? null : value,
                    ts.longValue());
            ArrayNode positions = caused.addArray();
            for (TestRecord<String, JsonNode> change : out.readRecordsToList()) {
                JsonNode envelope = readEnvelope(change.key());
                ObjectNode entry = changelog.addObject();
                entry.set("key", envelope.get("key"));
                entry.set("window", envelope.get("window"));
                entry.set("value", change.value() == null ? NullNode.getInstance() : change.value());
                entry.put("ts", change.timestamp());
                entry.put("cause", i);
                positions.add(changelog.size() - 1);
            }
        }
        ObjectNode response = NODES.objectNode();
        response.put("result", plan.stream() ? "stream" : "table");
        response.set("changelog", changelog);
        response.set("table", fold(changelog));
        response.set("caused", caused);
        return response;
    }

    /** The final table: the last value per (key, window), a null value deleting, sorted. */
    static ArrayNode fold(ArrayNode changelog) {
        Map<String, ObjectNode> rows = new LinkedHashMap<>();
        for (JsonNode change : changelog) {
            String id = change.get("key") + " " + change.get("window");
            if (change.get("value").isNull()) {
                rows.remove(id);
            } else {
                ObjectNode row = NODES.objectNode();
                row.set("key", change.get("key"));
                row.set("window", change.get("window"));
                row.set("value", change.get("value"));
                rows.put(id, row);
            }
        }
        Comparator<JsonNode> byKey = Comparator.comparing(
                (JsonNode row) -> row.get("key").isNull() ? null : row.get("key").textValue(),
                Comparator.nullsFirst(Comparator.naturalOrder()));
        Comparator<JsonNode> byStart = Comparator.comparing(
                (JsonNode row) -> row.get("window").isNull() ? null : row.get("window").get(0).longValue(),
                Comparator.nullsFirst(Comparator.naturalOrder()));
        Comparator<JsonNode> byEnd = Comparator.comparing(
                (JsonNode row) -> row.get("window").isNull() ? null : row.get("window").get(1).longValue(),
                Comparator.nullsFirst(Comparator.naturalOrder()));
        ArrayNode table = NODES.arrayNode();
        rows.values().stream().sorted(byKey.thenComparing(byStart).thenComparing(byEnd)).forEach(table::add);
        return table;
    }

    // -- The topology of a table -------------------------------------------------------------

    static Plan build(StreamsBuilder builder, JsonNode table) {
        String kind = text(table, "kind", "the table");
        switch (kind) {
            case "latest" -> {
                toOutput(builder.table(LEFT, Consumed.with(KEYS, VALUES)).toStream());
                return new Plan(Set.of(LEFT), false);
            }
            case "aggregate" -> {
                aggregate(builder, table);
                return new Plan(Set.of(LEFT), false);
            }
            case "join" -> {
                return new Plan(Set.of(LEFT, RIGHT), join(builder, table));
            }
            case HISTORY -> {
                history(builder, table);
                return new Plan(Set.of(LEFT), true);
            }
            default -> throw new BadRequest(
                    "the table's \"kind\" must be latest, aggregate, join or history, not \"" + kind + "\"");
        }
    }

    static void aggregate(StreamsBuilder builder, JsonNode table) {
        String source = text(table, "source", "the aggregate");
        String groupBy = optionalText(table, "group_by", "the aggregate");
        JsonNode window = table.get("window");
        boolean windowed = window != null && !window.isNull();
        JsonNode list = table.get("aggregations");
        if (list == null || !list.isArray() || list.isEmpty()) {
            throw new BadRequest("the aggregate's \"aggregations\" must be a non-empty list");
        }
        Aggregates aggregates = new Aggregates(list, source.equals("table"));
        if (source.equals("table")) {
            if (windowed) {
                throw new BadRequest("an aggregate of a table has no window (Kafka Streams windows streams only)");
            }
            toOutput(builder.table(LEFT, Consumed.with(KEYS, VALUES))
                    .groupBy((k, v) -> KeyValue.pair(groupBy == null ? k : keyOf(v, groupBy), v),
                            Grouped.with(KEYS, VALUES))
                    .aggregate(aggregates::init, aggregates::add, aggregates::subtract,
                            Materialized.<String, JsonNode, KeyValueStore<Bytes, byte[]>>with(KEYS, VALUES))
                    .toStream());
            return;
        }
        if (!source.equals("stream")) {
            throw new BadRequest("the aggregate's \"source\" must be stream or table, not \"" + source + "\"");
        }
        KStream<String, JsonNode> stream = builder.stream(LEFT, Consumed.with(KEYS, VALUES));
        KGroupedStream<String, JsonNode> grouped = groupBy == null
                ? stream.groupByKey(Grouped.with(KEYS, VALUES))
                : stream.groupBy((k, v) -> keyOf(v, groupBy), Grouped.with(KEYS, VALUES));
        if (!windowed) {
            toOutput(grouped.aggregate(aggregates::init, aggregates::add,
                    Materialized.<String, JsonNode, KeyValueStore<Bytes, byte[]>>with(KEYS, VALUES)).toStream());
            return;
        }
        String type = text(window, "type", "the window");
        Duration grace = Duration.ofMillis(millis(window, "grace", "the window"));
        switch (type) {
            case "tumbling", "hopping" -> {
                TimeWindows windows = TimeWindows.ofSizeAndGrace(
                        Duration.ofMillis(millis(window, "size", "the window")), grace);
                if (type.equals("hopping")) {
                    windows = windows.advanceBy(Duration.ofMillis(millis(window, "advance", "the window")));
                }
                toOutputWindowed(grouped.windowedBy(windows).aggregate(aggregates::init, aggregates::add,
                        Materialized.<String, JsonNode, WindowStore<Bytes, byte[]>>with(KEYS, VALUES)).toStream());
            }
            case "session" -> {
                Duration gap = Duration.ofMillis(millis(window, "gap", "the window"));
                SessionWindows windows = SessionWindows.ofInactivityGapAndGrace(gap, grace);
                // An in-memory session store drops a session exactly when it has closed (its end
                // + gap + grace behind stream time); the default RocksDB store drops whole
                // segments, so it may still find, and merge, a session that has closed.
                Materialized<String, JsonNode, SessionStore<Bytes, byte[]>> store =
                        Materialized.<String, JsonNode>as(
                                        Stores.inMemorySessionStore("sessions", gap.plus(grace)))
                                .withKeySerde(KEYS)
                                .withValueSerde(VALUES);
                toOutputWindowed(grouped.windowedBy(windows).aggregate(aggregates::init, aggregates::add,
                        aggregates::merge, store).toStream());
            }
            default -> throw new BadRequest(
                    "the window's \"type\" must be tumbling, hopping or session, not \"" + type + "\"");
        }
    }

    /** Builds the join; returns whether its result is a stream (else a table). */
    static boolean join(StreamsBuilder builder, JsonNode table) {
        String type = text(table, "type", "the join");
        String how = text(table, "how", "the join");
        String on = optionalText(table, "on", "the join");
        if (!List.of("inner", "left", "outer").contains(how)) {
            throw new BadRequest("the join's \"how\" must be inner, left or outer, not \"" + how + "\"");
        }
        ValueJoiner<JsonNode, JsonNode, JsonNode> joiner = (left, right) -> {
            ObjectNode joined = NODES.objectNode();
            joined.set("left", left == null ? NullNode.getInstance() : left);
            joined.set("right", right == null ? NullNode.getInstance() : right);
            return joined;
        };
        switch (type) {
            case "stream-table" -> {
                KStream<String, JsonNode> left = rekeyed(builder.stream(LEFT, Consumed.with(KEYS, VALUES)), on);
                // The table side is versioned: a stream record joins the table's value as of its
                // timestamp, and an out-of-order table update does not replace a newer version.
                KTable<String, JsonNode> right = builder.table(RIGHT, Consumed.with(KEYS, VALUES),
                        Materialized.<String, JsonNode>as(
                                        Stores.persistentVersionedKeyValueStore("right-versions", VERSIONS_KEPT))
                                .withKeySerde(KEYS)
                                .withValueSerde(VALUES));
                Joined<String, JsonNode, JsonNode> joined = Joined.with(KEYS, VALUES, VALUES);
                toOutput(switch (how) {
                    case "inner" -> left.join(right, joiner, joined);
                    case "left" -> left.leftJoin(right, joiner, joined);
                    default -> throw new BadRequest("a stream-table join is inner or left, not outer");
                });
                return true;
            }
            case "table-table" -> {
                KTable<String, JsonNode> left = builder.table(LEFT, Consumed.with(KEYS, VALUES));
                KTable<String, JsonNode> right = builder.table(RIGHT, Consumed.with(KEYS, VALUES));
                KTable<String, JsonNode> joined;
                if (on == null) {
                    joined = switch (how) {
                        case "inner" -> left.join(right, joiner);
                        case "left" -> left.leftJoin(right, joiner);
                        default -> left.outerJoin(right, joiner);
                    };
                } else {
                    // A foreign-key join: the left value's field names the right table's key.
                    Function<JsonNode, String> foreignKey = v -> keyOf(v, on);
                    joined = switch (how) {
                        case "inner" -> left.join(right, foreignKey, joiner);
                        case "left" -> left.leftJoin(right, foreignKey, joiner);
                        default -> throw new BadRequest("a foreign-key join (\"on\") is inner or left, not outer");
                    };
                }
                toOutput(joined.toStream());
                return false;
            }
            case "stream-stream" -> {
                KStream<String, JsonNode> left = rekeyed(builder.stream(LEFT, Consumed.with(KEYS, VALUES)), on);
                KStream<String, JsonNode> right = builder.stream(RIGHT, Consumed.with(KEYS, VALUES));
                JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(
                        Duration.ofMillis(millis(table, "within", "the join")),
                        Duration.ofMillis(millis(table, "grace", "the join")));
                StreamJoined<String, JsonNode, JsonNode> joined = StreamJoined.with(KEYS, VALUES, VALUES);
                toOutput(switch (how) {
                    case "inner" -> left.join(right, joiner, windows, joined);
                    case "left" -> left.leftJoin(right, joiner, windows, joined);
                    default -> left.outerJoin(right, joiner, windows, joined);
                });
                return true;
            }
            default -> throw new BadRequest(
                    "the join's \"type\" must be stream-table, table-table or stream-stream, not \"" + type + "\"");
        }
    }

    /** The left stream keyed by its field {@code on} (selectKey: the join then repartitions it). */
    static KStream<String, JsonNode> rekeyed(KStream<String, JsonNode> stream, String on) {
        return on == null ? stream : stream.selectKey((k, v) -> keyOf(v, on));
    }

    /**
     * A field's value as a key: a string as it is, any other value as its JSON text; null when
     * the record's value or the field is null or missing.
     */
    static String keyOf(JsonNode value, String field) {
        JsonNode v = field(value, field);
        if (v == null) {
            return null;
        }
        return v.isTextual() ? v.textValue() : v.toString();
    }

    /** A record value's field, or null (Java's) when the value or the field is null or missing. */
    static JsonNode field(JsonNode value, String field) {
        if (value == null || field == null) {
            return null;
        }
        JsonNode v = value.get(field);
        return v == null || v.isNull() ? null : v;
    }

    // -- History: a versioned key-value store (KIP-889) ---------------------------------------

    /**
     * A versioned store with the request's "retention" (ms; none: every version kept) that each
     * record is put into at its timestamp (a null value: a tombstone, a put of null); a null key
     * is skipped, as a table's source skips it. Each put's outcome goes to the output topic,
     * {"put": the validTo code, "not_put": whether the store refused it as older than its
     * observed stream time minus the retention}; after the records, the probes read the store.
     */
    static void history(StreamsBuilder builder, JsonNode table) {
        JsonNode retention = table.get("retention");
        Duration kept = retention == null || retention.isNull()
                ? VERSIONS_KEPT
                : Duration.ofMillis(millis(table, "retention", "the history"));
        builder.addStateStore(Stores.versionedKeyValueStoreBuilder(
                Stores.persistentVersionedKeyValueStore(HISTORY, kept), KEYS, VALUES));
        KStream<String, JsonNode> puts = builder.<String, JsonNode>stream(LEFT, Consumed.with(KEYS, VALUES))
                .process(() -> new Processor<String, JsonNode, String, JsonNode>() {
                    private ProcessorContext<String, JsonNode> context;
                    private VersionedKeyValueStore<String, JsonNode> store;

                    @Override
                    public void init(ProcessorContext<String, JsonNode> context) {
                        this.context = context;
                        this.store = context.getStateStore(HISTORY);
                    }

                    @Override
                    public void process(Record<String, JsonNode> record) {
                        if (record.key() == null) {
                            return;
                        }
                        long code = store.put(record.key(), record.value(), record.timestamp());
                        ObjectNode outcome = NODES.objectNode()
                                .put("put", code)
                                .put("not_put", code == VersionedKeyValueStore.PUT_RETURN_CODE_NOT_PUT);
                        context.forward(record.withValue(outcome));
                    }
                }, HISTORY);
        toOutput(puts);
    }

    /**
     * Each probe [key, asOf] answered by the store's get(key, asOf): null (no version then, or
     * older than the store's history retention), or {"value", "valid_from", "valid_to"}.
     */
    static ArrayNode probe(VersionedKeyValueStore<String, JsonNode> store, JsonNode probes) {
        ArrayNode answers = NODES.arrayNode();
        if (probes == null || probes.isNull()) {
            return answers;
        }
        if (!probes.isArray()) {
            throw new BadRequest("the request's \"probes\" must be a list of [key, epoch ms]");
        }
        for (JsonNode p : probes) {
            if (!p.isArray() || p.size() != 2 || !p.get(0).isTextual() || !p.get(1).canConvertToLong()) {
                throw new BadRequest("a probe must be [key, epoch ms], not " + p);
            }
            VersionedRecord<JsonNode> found = store.get(p.get(0).textValue(), p.get(1).longValue());
            if (found == null) {
                answers.addNull();
                continue;
            }
            ObjectNode answer = answers.addObject();
            answer.set("value", found.value());
            answer.put("valid_from", found.timestamp());
            if (found.validTo().isPresent()) {
                answer.put("valid_to", found.validTo().get());
            } else {
                answer.putNull("valid_to");
            }
        }
        return answers;
    }

    // The output topic's key is an envelope, {"key": ..., "window": [start, end] or null}, so that
    // windowed and plain keys (a null one too) travel the same way.

    static void toOutput(KStream<String, JsonNode> stream) {
        stream.map((k, v) -> KeyValue.pair(envelope(k, null), v)).to(OUT, Produced.with(KEYS, VALUES));
    }

    static void toOutputWindowed(KStream<Windowed<String>, JsonNode> stream) {
        stream.map((k, v) -> KeyValue.pair(envelope(k.key(), k.window()), v)).to(OUT, Produced.with(KEYS, VALUES));
    }

    static JsonNode readEnvelope(String envelope) {
        try {
            return JSON.readTree(envelope);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static String envelope(String key, Window window) {
        ObjectNode envelope = NODES.objectNode();
        envelope.put("key", key);
        if (window == null) {
            envelope.putNull("window");
        } else {
            envelope.putArray("window").add(window.start()).add(window.end());
        }
        return envelope.toString();
    }

    // -- Aggregate functions -----------------------------------------------------------------

    record Aggregation(String name, String fn, String field) {
        String hidden() {
            return "__" + name;
        }
    }

    /**
     * The initializer, aggregator, session merger and (for a table) subtractor of one aggregate.
     * A null record value has every field null. A field's null or missing value is skipped by
     * every function but count without a field. The aggregate holds each function's result under
     * its name, and what it needs to go on under "__" + name:
     *   count           the number of records (no field) or of the field's non-null values
     *   sum             the sum (a whole number while every value is one); null before any value.
     *                   __name: {"sum", "count"}
     *   avg             sum / count as a double, null without values. __name: {"sum", "count"}
     *   min, max        numbers by value, strings by their order
     *   count_distinct  the number of distinct values. __name: the values
     *   earliest,       the first / last value in input order. __name: its input position
     *   latest
     *   collect         every value in input order. __name: their input positions
     * A table aggregate also counts its members, "__members" (+1 per add, -1 per subtract).
     *
     * Session merges (Kafka Streams merges the sessions a record bridges, in time order, then
     * aggregates the record): counts and sums add, min and max combine, count_distinct unites,
     * and earliest, latest and collect go by input position, so that a merged session holds the
     * same values as one that was never split.
     */
    static final class Aggregates {
        static final Set<String> FUNCTIONS =
                Set.of("count", "sum", "min", "max", "avg", "count_distinct", "earliest", "latest", "collect");
        static final Set<String> OF_TABLES = Set.of("count", "sum", "avg");

        final List<Aggregation> list = new ArrayList<>();
        final boolean table;

        Aggregates(JsonNode aggregations, boolean table) {
            this.table = table;
            Set<String> names = new HashSet<>();
            for (JsonNode a : aggregations) {
                String where = "aggregation " + list.size();
                if (!a.isObject()) {
                    throw new BadRequest(where + " must be an object {\"name\", \"fn\", \"field\"}");
                }
                String name = text(a, "name", where);
                String fn = text(a, "fn", where);
                String field = optionalText(a, "field", where);
                if (name.isEmpty() || name.startsWith("__") || !names.add(name)) {
                    throw new BadRequest(where + ": the name \"" + name
                            + "\" is empty, taken, or starts with __ (the oracle's bookkeeping)");
                }
                if (!FUNCTIONS.contains(fn)) {
                    throw new BadRequest(where + ": \"fn\" must be one of " + FUNCTIONS + ", not \"" + fn + "\"");
                }
                if (table && !OF_TABLES.contains(fn)) {
                    throw new BadRequest(where + ": an aggregate of a table supports count, sum and avg, not " + fn);
                }
                if (field == null && !fn.equals("count")) {
                    throw new BadRequest(where + ": " + fn + " needs a \"field\"");
                }
                list.add(new Aggregation(name, fn, field));
            }
        }

        JsonNode init() {
            ObjectNode agg = NODES.objectNode();
            for (Aggregation a : list) {
                switch (a.fn()) {
                    case "count", "count_distinct" -> agg.put(a.name(), 0L);
                    case "collect" -> agg.putArray(a.name());
                    default -> agg.putNull(a.name());
                }
            }
            for (Aggregation a : list) {
                switch (a.fn()) {
                    case "sum", "avg" -> agg.putObject(a.hidden()).putNull("sum").put("count", 0L);
                    case "count_distinct", "collect" -> agg.putArray(a.hidden());
                    case "earliest", "latest" -> agg.putNull(a.hidden());
                    default -> { }
                }
            }
            if (table) {
                agg.put("__members", 0L);
            }
            return agg;
        }

        JsonNode add(String key, JsonNode value, JsonNode old) {
            ObjectNode agg = old.deepCopy();
            for (Aggregation a : list) {
                JsonNode v = field(value, a.field());
                if (a.fn().equals("count")) {
                    if (a.field() == null || v != null) {
                        agg.put(a.name(), agg.get(a.name()).longValue() + 1);
                    }
                    continue;
                }
                if (v == null) {
                    continue;
                }
                switch (a.fn()) {
                    case "sum", "avg" -> addToSum(agg, a, v, 1);
                    case "min" -> agg.set(a.name(), extreme(agg.get(a.name()), v, -1, a));
                    case "max" -> agg.set(a.name(), extreme(agg.get(a.name()), v, 1, a));
                    case "count_distinct" -> {
                        ArrayNode seen = (ArrayNode) agg.get(a.hidden());
                        if (!contains(seen, v)) {
                            seen.add(v);
                        }
                        agg.put(a.name(), (long) seen.size());
                    }
                    case "earliest" -> {
                        if (agg.get(a.hidden()).isNull() || current < agg.get(a.hidden()).intValue()) {
                            agg.set(a.name(), v);
                            agg.put(a.hidden(), current);
                        }
                    }
                    case "latest" -> {
                        if (agg.get(a.hidden()).isNull() || current >= agg.get(a.hidden()).intValue()) {
                            agg.set(a.name(), v);
                            agg.put(a.hidden(), current);
                        }
                    }
                    case "collect" -> {
                        ((ArrayNode) agg.get(a.name())).add(v);
                        ((ArrayNode) agg.get(a.hidden())).add(current);
                    }
                    default -> throw new IllegalStateException(a.fn());
                }
            }
            if (table) {
                agg.put("__members", agg.get("__members").longValue() + 1);
            }
            return agg;
        }

        /** A table's subtractor: takes a member's old value back (count, sum, avg only). */
        JsonNode subtract(String key, JsonNode value, JsonNode old) {
            ObjectNode agg = old.deepCopy();
            for (Aggregation a : list) {
                JsonNode v = field(value, a.field());
                if (a.fn().equals("count")) {
                    if (a.field() == null || v != null) {
                        agg.put(a.name(), agg.get(a.name()).longValue() - 1);
                    }
                } else if (v != null) {
                    addToSum(agg, a, v, -1);
                }
            }
            agg.put("__members", agg.get("__members").longValue() - 1);
            return agg;
        }

        /** Two sessions' aggregates as one: {@code earlier} is what was merged so far. */
        JsonNode merge(String key, JsonNode earlier, JsonNode later) {
            ObjectNode agg = earlier.deepCopy();
            for (Aggregation a : list) {
                switch (a.fn()) {
                    case "count" -> agg.put(a.name(), agg.get(a.name()).longValue() + later.get(a.name()).longValue());
                    case "sum", "avg" -> {
                        ObjectNode ours = (ObjectNode) agg.get(a.hidden());
                        JsonNode theirs = later.get(a.hidden());
                        ours.set("sum", plus(ours.get("sum"), theirs.get("sum"), 1));
                        ours.put("count", ours.get("count").longValue() + theirs.get("count").longValue());
                        present(agg, a);
                    }
                    case "min" -> agg.set(a.name(), extreme(agg.get(a.name()), later.get(a.name()), -1, a));
                    case "max" -> agg.set(a.name(), extreme(agg.get(a.name()), later.get(a.name()), 1, a));
                    case "count_distinct" -> {
                        ArrayNode seen = (ArrayNode) agg.get(a.hidden());
                        for (JsonNode v : later.get(a.hidden())) {
                            if (!contains(seen, v)) {
                                seen.add(v);
                            }
                        }
                        agg.put(a.name(), (long) seen.size());
                    }
                    case "earliest", "latest" -> {
                        JsonNode ours = agg.get(a.hidden());
                        JsonNode theirs = later.get(a.hidden());
                        boolean takeTheirs = !theirs.isNull() && (ours.isNull()
                                || (a.fn().equals("earliest") ? theirs.intValue() < ours.intValue()
                                        : theirs.intValue() > ours.intValue()));
                        if (takeTheirs) {
                            agg.set(a.name(), later.get(a.name()));
                            agg.set(a.hidden(), theirs);
                        }
                    }
                    case "collect" -> mergeByPosition(agg, later, a);
                    default -> throw new IllegalStateException(a.fn());
                }
            }
            return agg;
        }

        /** Adds (sign 1) or takes back (sign -1) a value of a sum or avg, then shows the result. */
        static void addToSum(ObjectNode agg, Aggregation a, JsonNode v, int sign) {
            if (!v.isNumber()) {
                throw new IllegalArgumentException(
                        a.fn() + " \"" + a.name() + "\" of a value that is not a number: " + v);
            }
            ObjectNode state = (ObjectNode) agg.get(a.hidden());
            state.set("sum", plus(state.get("sum"), v, sign));
            state.put("count", state.get("count").longValue() + sign);
            present(agg, a);
        }

        /**
         * sum + sign * v: a whole number while both are, else a double; a null (JSON) sum or v is
         * no value.
         */
        static JsonNode plus(JsonNode sum, JsonNode v, int sign) {
            if (v.isNull()) {
                return sum;
            }
            if (sum.isNull()) {
                sum = LongNode.valueOf(0);
            }
            if (sum.isIntegralNumber() && v.isIntegralNumber()) {
                return LongNode.valueOf(sum.longValue() + sign * v.longValue());
            }
            return DoubleNode.valueOf(sum.doubleValue() + sign * v.doubleValue());
        }

        /** A sum's or an avg's result from its state: null while no value counts. */
        static void present(ObjectNode agg, Aggregation a) {
            JsonNode state = agg.get(a.hidden());
            long count = state.get("count").longValue();
            if (count == 0) {
                agg.putNull(a.name());
            } else if (a.fn().equals("sum")) {
                agg.set(a.name(), state.get("sum"));
            } else {
                agg.put(a.name(), state.get("sum").doubleValue() / count);
            }
        }

        /** The smaller (sign -1) or larger (sign 1) of two values; null is no value. */
        static JsonNode extreme(JsonNode ours, JsonNode theirs, int sign, Aggregation a) {
            if (ours == null || ours.isNull()) {
                return theirs;
            }
            if (theirs == null || theirs.isNull()) {
                return ours;
            }
            int order;
            if (ours.isNumber() && theirs.isNumber()) {
                order = ours.decimalValue().compareTo(theirs.decimalValue());
            } else if (ours.isTextual() && theirs.isTextual()) {
                order = ours.textValue().compareTo(theirs.textValue());
            } else {
                throw new IllegalArgumentException(
                        a.fn() + " \"" + a.name() + "\" of values that do not compare: " + ours + " and " + theirs);
            }
            return Integer.signum(order) == -sign ? theirs : ours;
        }

        static boolean contains(ArrayNode values, JsonNode v) {
            for (JsonNode seen : values) {
                if (seen.equals(v)) {
                    return true;
                }
            }
            return false;
        }

        /** Two collects' values, in input position order (both are in that order already). */
        static void mergeByPosition(ObjectNode agg, JsonNode later, Aggregation a) {
            Iterator<JsonNode> ours = agg.get(a.name()).iterator();
            Iterator<JsonNode> oursAt = agg.get(a.hidden()).iterator();
            Iterator<JsonNode> theirs = later.get(a.name()).iterator();
            Iterator<JsonNode> theirsAt = later.get(a.hidden()).iterator();
            ArrayNode values = NODES.arrayNode();
            ArrayNode positions = NODES.arrayNode();
            JsonNode o = oursAt.hasNext() ? oursAt.next() : null;
            JsonNode t = theirsAt.hasNext() ? theirsAt.next() : null;
            while (o != null || t != null) {
                if (t == null || (o != null && o.intValue() <= t.intValue())) {
                    values.add(ours.next());
                    positions.add(o);
                    o = oursAt.hasNext() ? oursAt.next() : null;
                } else {
                    values.add(theirs.next());
                    positions.add(t);
                    t = theirsAt.hasNext() ? theirsAt.next() : null;
                }
            }
            agg.set(a.name(), values);
            agg.set(a.hidden(), positions);
        }
    }

    // -- JSON ----------------------------------------------------------------------------------

    /** Values as JSON; a null value (a tombstone) stays null both ways. */
    public static final class JsonSerde implements Serde<JsonNode> {
        public JsonSerde() { }

        @Override
        public Serializer<JsonNode> serializer() {
            return (topic, value) -> {
                try {
                    return value == null ? null : JSON.writeValueAsBytes(value);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            };
        }

        @Override
        public Deserializer<JsonNode> deserializer() {
            return (topic, bytes) -> {
                try {
                    return bytes == null ? null : JSON.readTree(bytes);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            };
        }
    }

    static JsonNode object(JsonNode parent, String name, String where) {
        JsonNode v = parent.get(name);
        if (v == null || !v.isObject()) {
            throw new BadRequest(where + "'s \"" + name + "\" must be an object, not " + v);
        }
        return v;
    }

    static String text(JsonNode parent, String name, String where) {
        JsonNode v = parent.get(name);
        if (v == null || !v.isTextual()) {
            throw new BadRequest(where + "'s \"" + name + "\" must be a string, not " + v);
        }
        return v.textValue();
    }

    static String optionalText(JsonNode parent, String name, String where) {
        JsonNode v = parent.get(name);
        return v == null || v.isNull() ? null : text(parent, name, where);
    }

    static long millis(JsonNode parent, String name, String where) {
        JsonNode v = parent.get(name);
        if (v == null || !v.isIntegralNumber() || !v.canConvertToLong() || v.longValue() < 0) {
            throw new BadRequest(where + "'s \"" + name + "\" must be milliseconds (a whole number >= 0), not " + v);
        }
        return v.longValue();
    }

    static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) {
            return;
        }
        try (var paths = Files.walk(root)) {
            for (Path path : paths.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(path);
            }
        }
    }
}
