package io.statefleet.deadletters;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ListenerExecutionFailedException;

class DeadLetterRecovererTest {
    @Test
    void theLetterNamesTheListenersExceptionNotSpringsWrapper() {
        var producer = new MockProducer<>(true, null, new ByteArraySerializer(), new ByteArraySerializer());
        var recoverer = new DeadLetterRecoverer(new KafkaTemplate<>(() -> producer), new DeadLetters("p.dead-letters", "p.retry"));
        var failed = new ConsumerRecord<>("p.payments", 1, 4, "k".getBytes(StandardCharsets.UTF_8), "v".getBytes(StandardCharsets.UTF_8));
        recoverer.accept(failed, new ListenerExecutionFailedException("Listener failed", new SocketTimeoutException("read timed out")));
        assertEquals(1, producer.history().size());
        var letter = producer.history().get(0);
        assertEquals("p.dead-letters", letter.topic());
        assertEquals("java.net.SocketTimeoutException", text(letter.headers().lastHeader("dlq.error.class").value()));
        assertEquals("read timed out", text(letter.headers().lastHeader("dlq.error.message").value()));
        assertEquals("p.retry", text(letter.headers().lastHeader("dlq.retry.topic").value()));
    }

    @Test
    void aLetterThatCannotBeWrittenFailsTheRecovery() {
        var producer = new MockProducer<>(false, null, new ByteArraySerializer(), new ByteArraySerializer());
        var recoverer = new DeadLetterRecoverer(new KafkaTemplate<>(() -> producer), new DeadLetters("d", "r"), java.time.Duration.ofMillis(50));
        var failed = new ConsumerRecord<>("t", 0, 0, (byte[]) null, new byte[] {1});
        assertThrows(KafkaException.class, () -> recoverer.accept(failed, new IllegalStateException("x")));
    }

    private static String text(byte[] bytes) {
        return new String(bytes, StandardCharsets.UTF_8);
    }
}
