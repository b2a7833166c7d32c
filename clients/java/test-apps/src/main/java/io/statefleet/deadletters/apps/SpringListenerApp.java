package io.statefleet.deadletters.apps;

import io.statefleet.deadletters.DeadLetterRecoverer;
import io.statefleet.deadletters.DeadLetters;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.util.backoff.FixedBackOff;

/**
 * A Spring Kafka listener (plain spring-kafka, no Spring Boot) whose failures go to the retry
 * scheduler through {@link DeadLetterRecoverer}. It reads its topic and its retry topic; a
 * record's value says how it fares: {@code fail-times=N;...} fails until the record has been
 * redelivered after N failures (its {@code dlq.attempt} reaches N), {@code fail-times=always;...}
 * never succeeds. A record processed is written to the processed topic with the attempt it
 * came with.
 *
 * <pre>java -cp statefleet-test-apps.jar io.statefleet.deadletters.apps.SpringListenerApp
 *     BOOTSTRAP GROUP TOPIC RETRY_TOPIC DEAD_LETTER_TOPIC PROCESSED_TOPIC</pre>
 */
public final class SpringListenerApp {
    private SpringListenerApp() {}

    /** What the listener throws: its class is the letter's error class. */
    public static final class PaymentDeclinedException extends RuntimeException {
        public PaymentDeclinedException(String message) {
            super(message);
        }
    }

    public static void main(String[] args) throws InterruptedException {
        String bootstrap = args[0], group = args[1], topic = args[2], retryTopic = args[3], deadLetters = args[4], processed = args[5];
        Map<String, Object> producerConfig = Map.of(
                ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
                ProducerConfig.ACKS_CONFIG, "all",
                ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class,
                ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        KafkaTemplate<byte[], byte[]> template = new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(producerConfig));
        Map<String, Object> consumerConfig = Map.of(
                ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
                ConsumerConfig.GROUP_ID_CONFIG, group,
                ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
                ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class,
                ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        ContainerProperties properties = new ContainerProperties(topic, retryTopic);
        properties.setMessageListener((MessageListener<byte[], byte[]>) record -> {
            int attempt = receivedAttempt(record);
            String failTimes = failTimes(new String(record.value(), StandardCharsets.UTF_8));
            if (failTimes.equals("always") || attempt < Integer.parseInt(failTimes)) {
                throw new PaymentDeclinedException("declined at attempt " + (attempt + 1));
            }
            ProducerRecord<byte[], byte[]> out = new ProducerRecord<>(processed, record.key(), record.value());
            out.headers().add("processed.attempt", Integer.toString(attempt).getBytes(StandardCharsets.UTF_8));
            template.send(out).join();
        });
        KafkaMessageListenerContainer<byte[], byte[]> container =
                new KafkaMessageListenerContainer<>(new DefaultKafkaConsumerFactory<>(consumerConfig), properties);
        // No in-memory retries: the first failure goes to the scheduler, which does the backing off.
        container.setCommonErrorHandler(new DefaultErrorHandler(
                new DeadLetterRecoverer(template, new DeadLetters(deadLetters, retryTopic)), new FixedBackOff(0L, 0L)));
        container.start();
        System.out.println("spring listener started on " + topic + " and " + retryTopic);
        Shutdown.awaitThen(container::stop);
    }

    /** The attempts the record has failed so far: its dlq.attempt, 0 on a first read. */
    private static int receivedAttempt(ConsumerRecord<byte[], byte[]> record) {
        Header header = record.headers().lastHeader(DeadLetters.ATTEMPT);
        return header == null ? 0 : Integer.parseInt(new String(header.value(), StandardCharsets.UTF_8));
    }

    private static String failTimes(String value) {
        for (String field : value.split(";")) {
            if (field.startsWith("fail-times=")) {
                return field.substring("fail-times=".length());
            }
        }
        return "0";
    }
}
