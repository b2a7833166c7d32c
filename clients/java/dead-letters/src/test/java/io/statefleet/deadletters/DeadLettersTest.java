package io.statefleet.deadletters;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.Test;

/** The byte-level examples of docs/dead-letter-protocol.md, written by the Java client. */
class DeadLettersTest {
    static final long FIRST_AT = 1767225600000L;
    static final byte[] KEY = "order-7".getBytes(StandardCharsets.UTF_8);
    static final byte[] VALUE = "{\"amount\": 12}".getBytes(StandardCharsets.UTF_8);

    static ConsumerRecord<byte[], byte[]> record(String topic, int partition, long offset, byte[] key, byte[] value, RecordHeaders headers) {
        return new ConsumerRecord<>(topic, partition, offset, FIRST_AT, TimestampType.CREATE_TIME, -1, -1, key, value, headers, Optional.empty());
    }

    static RecordHeaders headers(String... namesAndValues) {
        RecordHeaders headers = new RecordHeaders();
        for (int i = 0; i < namesAndValues.length; i += 2) {
            headers.add(namesAndValues[i], namesAndValues[i + 1].getBytes(StandardCharsets.UTF_8));
        }
        return headers;
    }

    static List<String> asText(ProducerRecord<byte[], byte[]> letter) {
        List<String> out = new ArrayList<>();
        for (Header header : letter.headers()) {
            out.add(header.key());
            out.add(new String(header.value(), StandardCharsets.UTF_8));
        }
        return out;
    }

    /** The headers of the example's letters (payments 2 @ 70, first failed at 1767225600000). */
    static List<String> paymentsLetter(String attempt, String errorClass, String message, String failedAt) {
        return List.of(
                "traceparent", "00-ab",
                "dlq.id", "4d34514c9e513d28851e0f987c91ffd1",
                "dlq.original.topic", "payments",
                "dlq.original.partition", "2",
                "dlq.original.offset", "70",
                "dlq.retry.topic", "retry",
                "dlq.attempt", attempt,
                "dlq.error.class", errorClass,
                "dlq.error.message", message,
                "dlq.first.failed.at", "1767225600000",
                "dlq.failed.at", failedAt);
    }

    static ProducerRecord<byte[], byte[]> firstFailure() {
        DeadLetters letters = new DeadLetters("dead-letters", "retry", () -> FIRST_AT);
        var failed = record("payments", 2, 70, KEY, VALUE, headers("traceparent", "00-ab"));
        return letters.letterFor(failed, new SocketTimeoutException("read timed out"));
    }

    @Test
    void aFirstFailureCarriesTheRecordAndEveryDlqHeaderAfterItsOwn() {
        ProducerRecord<byte[], byte[]> letter = firstFailure();
        assertEquals("dead-letters", letter.topic());
        assertNull(letter.partition());
        assertArrayEquals(new byte[] {0x6f, 0x72, 0x64, 0x65, 0x72, 0x2d, 0x37}, letter.key());
        assertArrayEquals(VALUE, letter.value());
        assertEquals(
                paymentsLetter("1", "java.net.SocketTimeoutException", "read timed out", "1767225600000"),
                asText(letter));
        assertArrayEquals(new byte[] {0x37, 0x30}, letter.headers().lastHeader("dlq.original.offset").value());
    }

    @Test
    void aReFailureOfARedeliveryKeepsIdOriginAndFirstFailureAndCountsOneMoreAttempt() {
        ProducerRecord<byte[], byte[]> first = firstFailure();
        // The scheduler redelivers key, value and every header to the retry topic.
        RecordHeaders redelivered = new RecordHeaders(first.headers().toArray());
        var again = record("retry", 5, 3, first.key(), first.value(), redelivered);
        DeadLetters letters = new DeadLetters("dead-letters", "other-retry", () -> FIRST_AT + 1000);
        ProducerRecord<byte[], byte[]> letter = letters.letterFor(again, new IllegalStateException("still down"));
        assertEquals(
                paymentsLetter("2", "java.lang.IllegalStateException", "still down", "1767225601000"),
                asText(letter));
    }

    @Test
    void aHeaderGivenTwiceCountsWithItsLastValueAndMissingOnesTakeTheRecordsPlace() {
        var again = record("retry", 1, 9, KEY, VALUE, headers("dlq.id", "abc", "dlq.attempt", "2", "dlq.attempt", "3", "dlq.original.offset", "x"));
        var letter = new DeadLetters("dead-letters", "retry", () -> 5L).letterFor(again, new RuntimeException());
        Map<String, String> dlq = new java.util.HashMap<>();
        List<String> text = asText(letter);
        for (int i = 0; i < text.size(); i += 2) {
            assertNull(dlq.put(text.get(i), text.get(i + 1)), "each dlq header once: " + text.get(i));
        }
        assertEquals("4", dlq.get("dlq.attempt"));
        assertEquals("retry", dlq.get("dlq.original.topic"));
        assertEquals("1", dlq.get("dlq.original.partition"));
        assertEquals("9", dlq.get("dlq.original.offset"));
        assertEquals("RuntimeException", dlq.get("dlq.error.message"));
        assertEquals("5", dlq.get("dlq.first.failed.at"));
    }

    @Test
    void nullKeysAndValuesAreKeptNullAndStringsAreWrittenAsUtf8() {
        var failed = new ConsumerRecord<String, String>("orders", 0, 1, null, "ü");
        var letter = DeadLetters.forFailure(failed, new IllegalArgumentException("bad"));
        assertNull(letter.key());
        assertArrayEquals(new byte[] {(byte) 0xc3, (byte) 0xbc}, letter.value());
        assertEquals("dead-letters", letter.topic());
        assertEquals(DeadLetters.deriveId("orders", 0, 1, null, letter.value()), new String(letter.headers().lastHeader("dlq.id").value(), StandardCharsets.UTF_8));
        assertThrows(IllegalArgumentException.class, () -> DeadLetters.forFailure(new ConsumerRecord<>("orders", 0, 1, null, 12L), new RuntimeException()));
    }

    @Test
    void anErrorMessageIsCutAt2000Characters() {
        String longMessage = "é".repeat(2500);
        assertEquals("é".repeat(2000), DeadLetters.errorMessage(new RuntimeException(longMessage)));
    }
}
