package io.statefleet.deadletters.apps;

import io.statefleet.deadletters.DeadLetterRecoverer;
import io.statefleet.deadletters.DeadLetters;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ConsumerRecordRecoverer;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.util.backoff.FixedBackOff;

/**
 * Spring Kafka listeners (plain spring-kafka, no Spring Boot) whose failures go to the retry
 * scheduler: one reads its topic and its retry topic and hands its failures to
 * {@link DeadLetterRecoverer}; the other reads a second topic (which its policy redelivers to)
 * and hands them to Spring's own {@link DeadLetterPublishingRecoverer}, whose
 * {@code kafka_dlt-*} headers the scheduler reads natively. A record's value says how it fares:
 * {@code fail-times=N;...} fails until the record has been redelivered after N failures (its
 * {@code dlq.attempt} reaches N), {@code fail-times=always;...} never succeeds. A record
 * processed is written to the processed topic with the attempt it came with.
 *
 * <pre>java -cp statefleet-test-apps.jar io.statefleet.deadletters.apps.SpringListenerApp
 *     BOOTSTRAP GROUP TOPIC RETRY_TOPIC DEAD_LETTER_TOPIC PROCESSED_TOPIC SPRING_RECOVERED_TOPIC</pre>
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
        String springRecovered = args[6];
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
        DefaultKafkaConsumerFactory<byte[], byte[]> consumers = new DefaultKafkaConsumerFactory<>(consumerConfig);
        MessageListener<byte[], byte[]> listener = record -> {
            int attempt = receivedAttempt(record);
            String failTimes = failTimes(new String(record.value(), StandardCharsets.UTF_8));
            if (failTimes.equals("always") || attempt < Integer.parseInt(failTimes)) {
                throw new PaymentDeclinedException("declined at attempt " + (attempt + 1));
            }
            ProducerRecord<byte[], byte[]> out = new ProducerRecord<>(processed, record.key(), record.value());
            out.headers().add("processed.attempt", Integer.toString(attempt).getBytes(StandardCharsets.UTF_8));
            template.send(out).join();
        };
        var ours = container(consumers, listener, new DeadLetterRecoverer(template, new DeadLetters(deadLetters, retryTopic)), topic, retryTopic);
        // Spring's recoverer sends to a partition of the dead-letter topic the producer chooses.
        var springs = container(consumers, listener,
                new DeadLetterPublishingRecoverer(template, (record, error) -> new TopicPartition(deadLetters, -1)), springRecovered);
        springs.getContainerProperties().setGroupId(group + "-spring");
        ours.start();
        springs.start();
        System.out.println("spring listeners started on " + topic + ", " + retryTopic + " and " + springRecovered);
        Shutdown.awaitThen(() -> {
            ours.stop();
            springs.stop();
        });
    }

    private static KafkaMessageListenerContainer<byte[], byte[]> container(
            DefaultKafkaConsumerFactory<byte[], byte[]> consumers,
            MessageListener<byte[], byte[]> listener,
            ConsumerRecordRecoverer recoverer,
            String... topics) {
        ContainerProperties properties = new ContainerProperties(topics);
        properties.setMessageListener(listener);
        KafkaMessageListenerContainer<byte[], byte[]> container = new KafkaMessageListenerContainer<>(consumers, properties);
        // No in-memory retries: the first failure goes to the scheduler, which does the backing off.
        container.setCommonErrorHandler(new DefaultErrorHandler(recoverer, new FixedBackOff(0L, 0L)));
        return container;
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
