package io.statefleet.deadletters;

import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.KafkaException;
import org.springframework.kafka.core.KafkaOperations;
import org.springframework.kafka.listener.ConsumerRecordRecoverer;
import org.springframework.kafka.listener.ListenerExecutionFailedException;

/**
 * Spring Kafka's recoverer writing the protocol's dead letters (in place of
 * {@code DeadLetterPublishingRecoverer}): give it to a {@code DefaultErrorHandler}, and a record
 * whose listener failed goes to the scheduler's {@code dead-letters} with the {@code dlq.*}
 * headers of {@link DeadLetters}. The error is the listener's own exception, not Spring's
 * {@link ListenerExecutionFailedException} around it.
 *
 * <p>The letter is sent before the recoverer returns, so the container commits the record's
 * offset only once its letter is written; a send that fails throws, and the error handler
 * keeps the record.
 */
public final class DeadLetterRecoverer implements ConsumerRecordRecoverer {
    private static final Duration DEFAULT_SEND_TIMEOUT = Duration.ofSeconds(30);

    private final KafkaOperations<byte[], byte[]> template;
    private final DeadLetters letters;
    private final Duration sendTimeout;

    /** @param template a template with byte-array serializers; @param letters its topics */
    public DeadLetterRecoverer(KafkaOperations<byte[], byte[]> template, DeadLetters letters) {
        this(template, letters, DEFAULT_SEND_TIMEOUT);
    }

    public DeadLetterRecoverer(KafkaOperations<byte[], byte[]> template, DeadLetters letters, Duration sendTimeout) {
        this.template = template;
        this.letters = letters;
        this.sendTimeout = sendTimeout;
    }

    @Override
    public void accept(ConsumerRecord<?, ?> record, Exception exception) {
        try {
            template.send(letters.letterFor(record, listenerError(exception))).get(sendTimeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new KafkaException("interrupted while writing the dead letter of " + place(record), e);
        } catch (ExecutionException | TimeoutException e) {
            throw new KafkaException("could not write the dead letter of " + place(record), e);
        }
    }

    /** The listener's exception inside Spring's wrappers. */
    static Throwable listenerError(Throwable exception) {
        Throwable error = exception;
        while (error instanceof ListenerExecutionFailedException && error.getCause() != null) {
            error = error.getCause();
        }
        return error;
    }

    private static String place(ConsumerRecord<?, ?> record) {
        return record.topic() + "-" + record.partition() + "@" + record.offset();
    }
}
