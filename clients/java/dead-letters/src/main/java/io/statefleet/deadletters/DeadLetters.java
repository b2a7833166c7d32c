package io.statefleet.deadletters;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.LongSupplier;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.utils.Bytes;

/**
 * The dead letter of a record whose processing failed, as the retry scheduler reads it
 * (docs/dead-letter-protocol.md): the record's key and value byte for byte, its own headers in
 * order, then the {@code dlq.*} headers.
 *
 * <p>A first failure gets a derived {@code dlq.id}, the record's place as its origin and attempt
 * 1. A record that carries a {@code dlq.id} is a redelivery: its id, origin, retry topic and first
 * failure time are kept and its attempt is the received one plus one, so the scheduler counts
 * the attempts of the whole round trip. The error class is Java's fully qualified class name.
 *
 * <pre>{@code
 * DeadLetters letters = new DeadLetters("dead-letters", "retry");
 * producer.send(letters.forFailure(record, exception)).get();
 * }</pre>
 */
public final class DeadLetters {
    public static final String ID = "dlq.id";
    public static final String ORIGINAL_TOPIC = "dlq.original.topic";
    public static final String ORIGINAL_PARTITION = "dlq.original.partition";
    public static final String ORIGINAL_OFFSET = "dlq.original.offset";
    public static final String RETRY_TOPIC = "dlq.retry.topic";
    public static final String ATTEMPT = "dlq.attempt";
    public static final String ERROR_CLASS = "dlq.error.class";
    public static final String ERROR_MESSAGE = "dlq.error.message";
    public static final String FIRST_FAILED_AT = "dlq.first.failed.at";
    public static final String FAILED_AT = "dlq.failed.at";

    /** Headers whose names start with it are the protocol's, rewritten on each failure. */
    public static final String DLQ_PREFIX = "dlq.";
    /** The scheduler keeps at most this many characters of an error message. */
    public static final int MAX_ERROR_MESSAGE = 2000;
    public static final String DEFAULT_DEAD_LETTER_TOPIC = "dead-letters";
    public static final String DEFAULT_RETRY_TOPIC = "retry";

    private static final DeadLetters DEFAULTS = new DeadLetters(DEFAULT_DEAD_LETTER_TOPIC, DEFAULT_RETRY_TOPIC);

    private final String deadLetterTopic;
    private final String retryTopic;
    private final LongSupplier clock;

    /**
     * @param deadLetterTopic where the letters go (the scheduler's {@code dead-letters}, with its prefix)
     * @param retryTopic where the scheduler is to redeliver a first failure (the consumer's retry topic)
     */
    public DeadLetters(String deadLetterTopic, String retryTopic) {
        this(deadLetterTopic, retryTopic, System::currentTimeMillis);
    }

    /** As above, with the clock that gives {@code dlq.failed.at} (epoch milliseconds). */
    public DeadLetters(String deadLetterTopic, String retryTopic, LongSupplier clock) {
        this.deadLetterTopic = requireText(deadLetterTopic, "deadLetterTopic");
        this.retryTopic = requireText(retryTopic, "retryTopic");
        this.clock = clock;
    }

    /** The dead letter of {@code record} on {@code dead-letters}, to be redelivered to {@code retry}. */
    public static ProducerRecord<byte[], byte[]> forFailure(ConsumerRecord<?, ?> record, Throwable error) {
        return DEFAULTS.letterFor(record, error);
    }

    public String deadLetterTopic() {
        return deadLetterTopic;
    }

    public String retryTopic() {
        return retryTopic;
    }

    /**
     * The dead letter of {@code record}, which failed with {@code error}. Its key and value must
     * be the bytes read ({@code byte[]}, {@link Bytes}, {@link ByteBuffer}, or a {@code String},
     * written back as UTF-8); a listener that deserializes to other types must hand over the
     * raw record.
     */
    public ProducerRecord<byte[], byte[]> letterFor(ConsumerRecord<?, ?> record, Throwable error) {
        long now = clock.getAsLong();
        byte[] key = rawBytes(record.key(), "key");
        byte[] value = rawBytes(record.value(), "value");
        Map<String, String> received = new HashMap<>();
        RecordHeaders headers = new RecordHeaders();
        for (Header header : record.headers()) {
            if (header.key().startsWith(DLQ_PREFIX)) {
                // A header given twice counts once, with its last value.
                received.put(header.key(), header.value() == null ? "" : new String(header.value(), StandardCharsets.UTF_8));
            } else {
                headers.add(header.key(), header.value());
            }
        }
        String receivedId = received.getOrDefault(ID, "");
        boolean redelivered = !receivedId.isEmpty();
        Map<String, String> dlq = new LinkedHashMap<>();
        if (redelivered) {
            dlq.put(ID, receivedId);
            dlq.put(ORIGINAL_TOPIC, textOr(received.get(ORIGINAL_TOPIC), record.topic()));
            dlq.put(ORIGINAL_PARTITION, Long.toString(numberOr(received.get(ORIGINAL_PARTITION), record.partition())));
            dlq.put(ORIGINAL_OFFSET, Long.toString(numberOr(received.get(ORIGINAL_OFFSET), record.offset())));
            dlq.put(RETRY_TOPIC, textOr(received.get(RETRY_TOPIC), retryTopic));
            dlq.put(ATTEMPT, Long.toString(numberOr(received.get(ATTEMPT), 0) + 1));
        } else {
            dlq.put(ID, deriveId(record.topic(), record.partition(), record.offset(), key, value));
            dlq.put(ORIGINAL_TOPIC, record.topic());
            dlq.put(ORIGINAL_PARTITION, Integer.toString(record.partition()));
            dlq.put(ORIGINAL_OFFSET, Long.toString(record.offset()));
            dlq.put(RETRY_TOPIC, retryTopic);
            dlq.put(ATTEMPT, "1");
        }
        dlq.put(ERROR_CLASS, error.getClass().getName());
        dlq.put(ERROR_MESSAGE, errorMessage(error));
        dlq.put(FIRST_FAILED_AT, Long.toString(redelivered ? numberOr(received.get(FIRST_FAILED_AT), now) : now));
        dlq.put(FAILED_AT, Long.toString(now));
        dlq.forEach((name, text) -> headers.add(name, text.getBytes(StandardCharsets.UTF_8)));
        return new ProducerRecord<>(deadLetterTopic, null, null, key, value, headers);
    }

    /**
     * The {@code dlq.id} of a first failure: the first 32 hex digits of SHA-256 over
     * {@code topic NUL partition NUL offset NUL key NUL value} (a null key or value as empty).
     */
    public static String deriveId(String topic, int partition, long offset, byte[] key, byte[] value) {
        MessageDigest sha = sha256();
        for (String part : new String[] {topic, Integer.toString(partition), Long.toString(offset)}) {
            sha.update(part.getBytes(StandardCharsets.UTF_8));
            sha.update((byte) 0);
        }
        if (key != null) {
            sha.update(key);
        }
        sha.update((byte) 0);
        if (value != null) {
            sha.update(value);
        }
        return HexFormat.of().formatHex(sha.digest()).substring(0, 32);
    }

    /** The error's message, or its class's simple name when it has none; at most 2,000 characters. */
    static String errorMessage(Throwable error) {
        String message = error.getMessage();
        if (message == null || message.isEmpty()) {
            message = error.getClass().getSimpleName();
        }
        if (message.codePointCount(0, message.length()) > MAX_ERROR_MESSAGE) {
            message = message.substring(0, message.offsetByCodePoints(0, MAX_ERROR_MESSAGE));
        }
        return message;
    }

    private static byte[] rawBytes(Object data, String what) {
        if (data == null || data instanceof byte[]) {
            return (byte[]) data;
        }
        if (data instanceof Bytes bytes) {
            return bytes.get();
        }
        if (data instanceof ByteBuffer buffer) {
            byte[] copy = new byte[buffer.remaining()];
            buffer.duplicate().get(copy);
            return copy;
        }
        if (data instanceof String text) {
            return text.getBytes(StandardCharsets.UTF_8);
        }
        throw new IllegalArgumentException("a dead letter keeps the record's " + what + " bytes as read: consume with "
                + "ByteArrayDeserializer (or StringDeserializer), not as " + data.getClass().getName());
    }

    private static String textOr(String text, String fallback) {
        return text == null || text.isEmpty() ? fallback : text;
    }

    private static long numberOr(String text, long fallback) {
        if (text == null) {
            return fallback;
        }
        try {
            return Long.parseLong(text.strip());
        } catch (NumberFormatException e) {
            return fallback;
        }
    }

    private static String requireText(String text, String name) {
        if (text == null || text.isEmpty()) {
            throw new IllegalArgumentException(name + " must name a topic");
        }
        return text;
    }

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java platform has SHA-256", e);
        }
    }
}
