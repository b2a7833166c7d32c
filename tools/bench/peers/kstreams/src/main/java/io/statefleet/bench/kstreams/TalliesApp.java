package io.statefleet.bench.kstreams;

import io.statefleet.bench.kstreams.Model.AccountEvent;
import io.statefleet.bench.kstreams.Model.Counts;
import io.statefleet.bench.kstreams.Model.CountsAndLogin;
import io.statefleet.bench.kstreams.Model.Login;
import io.statefleet.bench.kstreams.Model.Membership;
import io.statefleet.bench.kstreams.Model.Tally;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The statefleet tally (services/tallies/domain.py) as a Kafka Streams topology.
 *
 * <pre>
 * account-events ─ groupByKey ─ aggregate: membership per account, version-checked
 *                    └ groupBy program ─ aggregate (adder/subtractor) ─ counts per program ─┐
 * logins ───────── map to (program, ts) ─ groupByKey ─ reduce max ─ last login per program ─┴ outerJoin ─▶ program-tallies
 * </pre>
 *
 * <p>Stores are the default RocksDB ones with changelogs; the record cache and the 1 s commit
 * interval decide how often a program's tally is written, as statefleet publishes once a second.
 *
 * <pre>
 * java -jar statefleet-kstreams-tallies.jar --bootstrap 127.0.0.1:9092 --prefix p. \
 *     --application-id p.kstreams-tallies --state-dir /tmp/x [--processing-guarantee exactly_once_v2] [--threads 1]
 * </pre>
 *
 * <p>Prints {@code first-record-at-ms <epoch ms>} on stdout when the first input record reaches
 * the topology, which is when the benchmark's clock starts.
 */
public final class TalliesApp {
    private static final AtomicBoolean FIRST_SEEN = new AtomicBoolean();

    private TalliesApp() {}

    private static void markFirstRecord() {
        if (!FIRST_SEEN.get() && FIRST_SEEN.compareAndSet(false, true)) {
            System.out.println("first-record-at-ms " + System.currentTimeMillis());
            System.out.flush();
        }
    }

    static Topology topology(String prefix) {
        StreamsBuilder builder = new StreamsBuilder();
        Serde<String> keys = Serdes.String();

        KStream<String, AccountEvent> events = builder.stream(
                prefix + "account-events", Consumed.with(keys, new JsonSerde<>(AccountEvent.class)));
        KStream<String, Login> logins = builder.stream(
                prefix + "logins", Consumed.with(keys, new JsonSerde<>(Login.class)));

        KTable<String, Membership> memberships = events
                .peek((account, event) -> markFirstRecord())
                .groupByKey()
                .aggregate(
                        () -> Membership.NONE,
                        (account, event, membership) -> membership.apply(event),
                        Materialized.<String, Membership, KeyValueStore<Bytes, byte[]>>as("memberships")
                                .withKeySerde(keys)
                                .withValueSerde(new JsonSerde<>(Membership.class)));

        // A membership moving from one status to another reaches the program as the
        // subtractor on the old value and the adder on the new one.
        KTable<String, Counts> counts = memberships
                .groupBy(
                        (account, membership) -> KeyValue.pair(membership.programId(), membership.status()),
                        Grouped.with("memberships-by-program", keys, Serdes.String()))
                .aggregate(
                        () -> Counts.ZERO,
                        (program, status, total) -> total.plus(status, 1),
                        (program, status, total) -> total.plus(status, -1),
                        Materialized.<String, Counts, KeyValueStore<Bytes, byte[]>>as("program-counts")
                                .withKeySerde(keys)
                                .withValueSerde(new JsonSerde<>(Counts.class)));

        KTable<String, Long> lastLogins = logins
                .peek((account, login) -> markFirstRecord())
                .map((account, login) -> KeyValue.pair(login.programId(), login.ts()))
                .groupByKey(Grouped.with("logins-by-program", keys, Serdes.Long()))
                .reduce(
                        Math::max,
                        Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("program-last-login")
                                .withKeySerde(keys)
                                .withValueSerde(Serdes.Long()));

        counts.outerJoin(lastLogins, CountsAndLogin::new)
                .toStream()
                .mapValues((program, joined) -> joined == null ? null : Tally.of(program, joined))
                .to(prefix + "program-tallies", Produced.with(keys, new JsonSerde<>(Tally.class)));
        return builder.build();
    }

    static Properties config(Map<String, String> args) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("application-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.getOrDefault("bootstrap", "127.0.0.1:9092"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                args.getOrDefault("processing-guarantee", StreamsConfig.AT_LEAST_ONCE));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args.getOrDefault("threads", "1")));
        // statefleet publishes changed tallies every second; the default would be 30 s (100 ms with EOS).
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        return props;
    }

    static Map<String, String> parseArgs(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + String.join(" ", argv));
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        for (String required : new String[] {"prefix", "application-id", "state-dir"}) {
            if (!args.containsKey(required)) {
                throw new IllegalArgumentException("--" + required + " is required");
            }
        }
        return args;
    }

    public static void main(String[] argv) throws InterruptedException {
        Map<String, String> args = parseArgs(argv);
        KafkaStreams streams = new KafkaStreams(topology(args.get("prefix")), config(args));
        CountDownLatch stopped = new CountDownLatch(1);
        int[] exitCode = {0};
        streams.setUncaughtExceptionHandler(error -> {
            System.err.println("kstreams-tallies: stream thread failed: " + error);
            exitCode[0] = 1;
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            stopped.countDown();
        }, "kstreams-tallies-shutdown"));
        streams.start();
        stopped.await();
        // A client that stopped by itself (not through the shutdown hook) has failed.
        if (exitCode[0] != 0) {
            streams.close(Duration.ofSeconds(10));
            System.exit(exitCode[0]);
        }
    }
}
