// Prints Kafka Streams' Topology.describe() for each topology file given, each followed by
// a line "=====". A file has one line per call, in order (names and topics without spaces):
//   source NAME TOPIC[,TOPIC...]          addSource
//   proc NAME PARENT[,PARENT...]          addProcessor
//   store STORE PROCESSOR                 addStateStore (first use) or connectProcessorAndStateStores
//   sink NAME TOPIC PARENT[,PARENT...]    addSink
//   global STORE TOPIC SOURCE PROCESSOR   addGlobalStore
// tests/integration/processing/test_describe_kafka.py compares eddyline's describe() with it.
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HashSet;
import java.util.Set;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.ContextualProcessor;
import org.apache.kafka.streams.processor.api.ProcessorSupplier;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.Stores;

public class DescribeTopologies {
  private static ProcessorSupplier<Object, Object, Object, Object> nothing() {
    return () -> new ContextualProcessor<Object, Object, Object, Object>() {
      @Override
      public void process(final Record<Object, Object> record) {}
    };
  }

  private static ProcessorSupplier<String, String, Void, Void> globalNothing() {
    return () -> new ContextualProcessor<String, String, Void, Void>() {
      @Override
      public void process(final Record<String, String> record) {}
    };
  }

  public static void main(final String[] files) throws Exception {
    for (final String file : files) {
      final Topology topology = new Topology();
      final Set<String> stores = new HashSet<>();
      for (final String line : Files.readAllLines(Paths.get(file))) {
        final String[] f = line.split(" ");
        switch (f[0]) {
          case "source":
            topology.addSource(f[1], f[2].split(","));
            break;
          case "proc":
            topology.addProcessor(f[1], nothing(), f[2].split(","));
            break;
          case "sink":
            topology.addSink(f[1], f[2], f[3].split(","));
            break;
          case "store":
            if (stores.add(f[1])) {
              topology.addStateStore(
                  Stores.keyValueStoreBuilder(
                      Stores.persistentKeyValueStore(f[1]), Serdes.String(), Serdes.String()),
                  f[2]);
            } else {
              topology.connectProcessorAndStateStores(f[2], f[1]);
            }
            break;
          case "global":
            topology.addGlobalStore(
                Stores.keyValueStoreBuilder(
                        Stores.persistentKeyValueStore(f[1]), Serdes.String(), Serdes.String())
                    .withLoggingDisabled(),
                f[3],
                Serdes.String().deserializer(),
                Serdes.String().deserializer(),
                f[2],
                f[4],
                globalNothing());
            break;
          default:
            throw new IllegalArgumentException("unknown line: " + line);
        }
      }
      System.out.print(topology.describe());
      System.out.println("=====");
    }
  }
}
