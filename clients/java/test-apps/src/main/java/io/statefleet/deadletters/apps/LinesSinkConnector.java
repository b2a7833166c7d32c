package io.statefleet.deadletters.apps;

import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

/**
 * A sink connector that appends each record's value to a file, one line a record (as
 * {@code String.valueOf} of what the converter made of it). Its records come through Connect's
 * converters and transforms first; those that fail there go to the connector's dead-letter queue
 * and never reach it.
 */
public final class LinesSinkConnector extends SinkConnector {
    static final String FILE = "file";
    static final ConfigDef CONFIG = new ConfigDef().define(FILE, ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "the file the values are appended to");

    private Map<String, String> settings = Map.of();

    @Override
    public void start(Map<String, String> props) {
        settings = Map.copyOf(props);
    }

    @Override
    public Class<? extends Task> taskClass() {
        return LinesSinkTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        // One file: one task writes it.
        return Collections.singletonList(settings);
    }

    @Override
    public void stop() {}

    @Override
    public ConfigDef config() {
        return CONFIG;
    }

    @Override
    public String version() {
        return "1.0.0";
    }
}
