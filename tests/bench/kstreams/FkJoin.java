// The foreign-key join of `make bench-joins` in Kafka Streams: an orders table joined with a
// customers table by the customer id each order names (KIP-213), every joined row to an output
// topic. The same topology as tests/bench/bench_joins_eddyline.py, so the benchmark compares the
// engines, not the programs. Compiled by the Makefile with javac against the jars of
// tools/kafka/pom.xml.
//
// Values are strings: an order is "CUSTOMER_ID|AMOUNT", a customer "NAME|TIER"; a joined row is
// "ORDER|CUSTOMER" (both values as they are), which eddyline's joiner writes byte for byte alike.
//
// Usage: java -cp <libs>/*:<classes> FkJoin CONFIG_FILE ORDERS_TOPIC CUSTOMERS_TOPIC OUTPUT_TOPIC
// CONFIG_FILE is a .properties file of StreamsConfig settings written by the benchmark. The
// program runs until SIGTERM (closes cleanly) and prints "RUNNING" once its state is RUNNING.

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class FkJoin {
    private FkJoin() {}

    public static void main(String[] args) throws IOException, InterruptedException {
        if (args.length != 4) {
            System.err.println("usage: FkJoin CONFIG_FILE ORDERS_TOPIC CUSTOMERS_TOPIC OUTPUT_TOPIC");
            System.exit(2);
        }
        Properties props = new Properties();
        try (InputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        StreamsBuilder builder = new StreamsBuilder();
        KTable<String, String> orders = builder.table(
            args[1],
            Consumed.with(Serdes.String(), Serdes.String()),
            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("orders"));
        KTable<String, String> customers = builder.table(
            args[2],
            Consumed.with(Serdes.String(), Serdes.String()),
            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("customers"));
        orders
            .join(
                customers,
                order -> order.substring(0, order.indexOf('|')),
                (order, customer) -> order + "|" + customer)
            .toStream()
            .to(args[3], Produced.with(Serdes.String(), Serdes.String()));

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
