package io.statefleet.deadletters.apps;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Collection;
import java.util.Map;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/** {@link LinesSinkConnector}'s task: each value a line of its file. */
public final class LinesSinkTask extends SinkTask {
    private Path file;

    @Override
    public void start(Map<String, String> props) {
        file = Path.of(props.get(LinesSinkConnector.FILE));
    }

    @Override
    public void put(Collection<SinkRecord> records) {
        StringBuilder lines = new StringBuilder();
        for (SinkRecord record : records) {
            lines.append(record.value()).append('\n');
        }
        try {
            Files.writeString(file, lines, StandardCharsets.UTF_8, StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        } catch (IOException e) {
            throw new ConnectException("could not append to " + file, e);
        }
    }

    @Override
    public void stop() {}

    @Override
    public String version() {
        return "1.0.0";
    }
}
