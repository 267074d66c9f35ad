// The word count of `make bench-kafka` in Kafka Streams: lines split into words, groupBy
// through a repartition topic, count into a RocksDB store, every new count to an output topic.
// The same topology as examples/wordcount (eddyline), so the benchmark compares the engines,
// not the programs. Compiled by the Makefile with javac against the jars of tools/kafka/pom.xml.
//
// Usage: java -cp <libs>/*:<classes> WordCount CONFIG_FILE INPUT_TOPIC OUTPUT_TOPIC
// CONFIG_FILE is a .properties file of StreamsConfig settings, written by the benchmark
// (tests/bench/bench_kafka.py), which also prints it. The program runs until it is killed
// or gets SIGTERM (then it closes cleanly); it prints "RUNNING" once its state is RUNNING.

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class WordCount {
    private WordCount() {}

    public static void main(String[] args) throws IOException, InterruptedException {
        if (args.length != 3) {
            System.err.println("usage: WordCount CONFIG_FILE INPUT_TOPIC OUTPUT_TOPIC");
            System.exit(2);
        }
        Properties props = new Properties();
        try (InputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[1], Consumed.with(Serdes.ByteArray(), Serdes.String()))
            // Python's str.split(): runs of whitespace, no empty words.
            .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).trim().split("\\s+")))
            .filter((key, word) -> !word.isEmpty())
            .groupBy((key, word) -> word, Grouped.with(Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts"))
            .toStream()
            .to(args[2], Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch closed = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.out.println("RUNNING");
                System.out.flush();
            }
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                closed.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            closed.countDown();
        }));
        streams.start();
        closed.await();
        if (streams.state() == KafkaStreams.State.ERROR) {
            System.err.println("Kafka Streams stopped in state ERROR");
            System.exit(1);
        }
    }
}
