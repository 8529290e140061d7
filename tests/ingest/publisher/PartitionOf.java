// Prints the partition Apache Kafka's Java producer picks for each key of stdin (one key a
// line, as hex of its bytes) among the partition counts given as arguments, one line a key:
//   <hex key> TAB <partition for the first count> TAB <for the second> ...
// BuiltInPartitioner.partitionForKey is what the default partitioner does with a keyed
// record. Run by tests/ingest/publisher/test_partition_rule.py with the broker's jars.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;

public class PartitionOf {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            byte[] key = HexFormat.of().parseHex(line.trim());
            StringBuilder out = new StringBuilder(line.trim());
            for (String count : args) {
                out.append('\t').append(BuiltInPartitioner.partitionForKey(key, Integer.parseInt(count)));
            }
            System.out.println(out);
        }
    }
}
