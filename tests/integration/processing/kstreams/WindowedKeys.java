// Kafka Streams' windowed-key serdes on lines of stdin, for test_windowed_serdes_kafka.py:
//   "serialize time <key> <start> <end>"   -> hex of TimeWindowedSerializer<String>
//   "serialize session <key> <start> <end>" -> hex of SessionWindowedSerializer<String>
//   "deserialize time <size> <hex>"          -> "<key> <start> <end>" by TimeWindowedDeserializer
//   "deserialize session <hex>"              -> "<key> <start> <end>" by SessionWindowedDeserializer
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HexFormat;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.kstream.internals.SessionWindow;
import org.apache.kafka.streams.kstream.internals.TimeWindow;

public class WindowedKeys {
    public static void main(String[] args) throws Exception {
        HexFormat hex = HexFormat.of();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(" ");
            Windowed<String> w;
            if (f[0].equals("serialize")) {
                long start = Long.parseLong(f[3]), end = Long.parseLong(f[4]);
                byte[] bytes;
                if (f[1].equals("time")) {
                    w = new Windowed<>(f[2], new TimeWindow(start, end));
                    bytes = WindowedSerdes.timeWindowedSerdeFrom(String.class, end - start)
                        .serializer().serialize("t", w);
                } else {
                    w = new Windowed<>(f[2], new SessionWindow(start, end));
                    bytes = WindowedSerdes.sessionWindowedSerdeFrom(String.class)
                        .serializer().serialize("t", w);
                }
                System.out.println(hex.formatHex(bytes));
            } else {
                if (f[1].equals("time")) {
                    w = WindowedSerdes.timeWindowedSerdeFrom(String.class, Long.parseLong(f[2]))
                        .deserializer().deserialize("t", hex.parseHex(f[3]));
                } else {
                    w = WindowedSerdes.sessionWindowedSerdeFrom(String.class)
                        .deserializer().deserialize("t", hex.parseHex(f[2]));
                }
                System.out.println(w.key() + " " + w.window().start() + " " + w.window().end());
            }
        }
    }
}
