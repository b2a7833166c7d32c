package io.statefleet.deadletters.apps;

import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.LogAndContinueExceptionHandler;
import org.apache.kafka.streams.errors.LogAndContinueProcessingExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * A Kafka Streams application with its dead-letter queue (KIP-1034): it reads amounts (8-byte
 * longs) and writes them doubled. A value that is not a long fails to deserialize, a negative
 * amount fails in processing; the handlers log either, send its record to the dead-letter topic
 * and go on.
 *
 * <pre>java -cp statefleet-test-apps.jar io.statefleet.deadletters.apps.StreamsApp
 *     BOOTSTRAP APPLICATION_ID INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC STATE_DIR</pre>
 */
public final class StreamsApp {
    private StreamsApp() {}

    /** What processing a negative amount throws: its class is the letter's error class. */
    public static final class NegativeAmountException extends RuntimeException {
        public NegativeAmountException(String message) {
            super(message);
        }
    }

    public static void main(String[] args) throws InterruptedException {
        String bootstrap = args[0], applicationId = args[1], input = args[2], output = args[3], deadLetters = args[4], stateDir = args[5];
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.Long()))
                .mapValues(amount -> {
                    if (amount < 0) {
                        throw new NegativeAmountException("negative amount " + amount);
                    }
                    return amount * 2;
                })
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        config.put(StreamsConfig.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME_CONFIG, deadLetters);
        config.put(StreamsConfig.DESERIALIZATION_EXCEPTION_HANDLER_CLASS_CONFIG, LogAndContinueExceptionHandler.class);
        config.put(StreamsConfig.PROCESSING_EXCEPTION_HANDLER_CLASS_CONFIG, LogAndContinueProcessingExceptionHandler.class);
        KafkaStreams streams = new KafkaStreams(builder.build(), config);
        streams.start();
        System.out.println("streams application " + applicationId + " started on " + input);
        Shutdown.awaitThen(streams::close);
    }
}
