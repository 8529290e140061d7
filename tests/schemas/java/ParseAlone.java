// Parses each schema file named on the command line alone (a fresh Schema.Parser per
// file, as a producer in Java loads one) and prints, per file, one line:
//   <file> TAB ok TAB <CRC-64-AVRO of the Parsing Canonical Form, 8 bytes little-endian, hex>
//   <file> TAB error TAB <the parser's message>
// Exit status 1 when any file failed. Run by tests/schemas/test_standalone_schemas.py.
import java.io.File;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;

public class ParseAlone {
    public static void main(String[] args) {
        boolean failed = false;
        for (String path : args) {
            try {
                Schema schema = new Schema.Parser().parse(new File(path));
                long fingerprint = SchemaNormalization.parsingFingerprint64(schema);
                StringBuilder hex = new StringBuilder();
                // the single-object header carries the fingerprint little-endian
                for (int i = 0; i < 8; i++) {
                    hex.append(String.format("%02x", (fingerprint >>> (8 * i)) & 0xff));
                }
                System.out.println(path + "\tok\t" + hex);
            } catch (Exception e) {
                failed = true;
                String message = String.valueOf(e.getMessage()).replace('\n', ' ');
                System.out.println(path + "\terror\t" + e.getClass().getSimpleName() + ": " + message);
            }
        }
        System.exit(failed ? 1 : 0);
    }
}
